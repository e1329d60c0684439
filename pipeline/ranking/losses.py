"""The three training objectives, as small plain functions with one shared signature:

    loss(scores, lengths, pairs, truncated=None) -> scalar tensor

`scores` (n,) are the model's outputs for the n prompts of a batch (higher = longer answer),
`lengths` (n,) their label lengths (mean output tokens), and `pairs` (m, 2) a LongTensor of
index pairs (i, j) into the batch that the pairwise loss compares (label y = sign(len_i - len_j)).
`truncated` (n,) bool marks labels that are lower bounds (an answer cut at max_tokens,
`pipeline.ranking.labels`). Pointwise and listwise use every prompt of the batch and ignore
`pairs`, but honour `truncated`; pairwise ignores `truncated`, since its pairs already obey the
rule (a cut answer is never the shorter member). Keeping one signature lets the LightningModule
call any method the same way. No Lightning here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

METHODS = ("pairwise", "pointwise", "listwise")


def pairwise_loss(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    pairs: torch.Tensor,
    truncated: torch.Tensor | None = None,
    margin: float = 1.0,
    margin_per_log_length: float = 0.0,
) -> torch.Tensor:
    """PARS: mean over pairs of max(0, -y * (s_i - s_j) + m_ij), y = +1 when i's answer is longer.

    m_ij = margin + margin_per_log_length * |log(1 + len_i) - log(1 + len_j)|: with the second
    term, a pair whose lengths differ by 10x must be separated further than one that differs by
    1.3x (a graded margin); 0 gives the paper's constant margin."""
    if pairs.numel() == 0:
        # A batch without a valid pair contributes nothing, but must keep the graph connected
        # (DDP and Lightning's backward expect a tensor that depends on the parameters).
        return scores.sum() * 0.0
    i, j = pairs[:, 0], pairs[:, 1]
    y = torch.sign(lengths[i] - lengths[j]).to(scores.dtype)
    m = margin
    if margin_per_log_length:
        log_len = torch.log1p(lengths.to(scores.dtype))
        m = margin + margin_per_log_length * (log_len[i] - log_len[j]).abs()
    return torch.relu(-y * (scores[i] - scores[j]) + m).mean()


def pointwise_loss(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    pairs: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
) -> torch.Tensor:
    """S3/SSJF family: mean squared error of the score against log(1 + length).

    A cut answer's length is a lower bound: scoring it above its label costs nothing, only below
    (the censored term of a Tobit regression, as a squared hinge)."""
    target = torch.log1p(lengths.to(scores.dtype))
    if truncated is None or not bool(truncated.any()):
        return F.mse_loss(scores, target)
    error = scores - target
    error = torch.where(truncated.to(torch.bool), error.clamp(max=0.0), error)
    return error.square().mean()


def listwise_loss(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    pairs: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
) -> torch.Tensor:
    """vllm-ltr family: ListMLE, the batch being one list ordered by length (longest first).

    -log P(order) = sum_k [ logsumexp(s_{pi(k..n)}) - s_{pi(k)} ], divided by n so the scale
    (and hence the learning rate that suits it) does not depend on the batch size. Equal lengths
    are ordered at random (torch's global generator): the batch's own order is not neutral (with
    micro_batches > 1 the collate sorts it by prompt token count).

    With cut answers the order is known only in part: a cut prompt's true length may exceed any
    prompt listed before it. Each prompt's term then compares it with the prompts surely not
    longer: itself and the uncut prompts after it (an uncut prompt after a cut one is surely
    shorter; a cut one after any prompt may be longer). With nothing cut this is ListMLE.
    """
    # shuffle, then a stable sort: ties keep the shuffled order, distinct lengths sort as before
    perm = torch.randperm(lengths.shape[0], device=lengths.device)
    order = perm[torch.argsort(lengths[perm], descending=True, stable=True)]
    s = scores[order]
    if truncated is None or not bool(truncated.any()):
        # logsumexp over each suffix s[k:], computed as a reversed cumulative logsumexp.
        suffix_lse = torch.logcumsumexp(s.flip(0), dim=0).flip(0)
        return (suffix_lse - s).mean()
    uncut = ~truncated.to(torch.bool)[order]
    # logsumexp over the uncut prompts strictly after k (-inf where there are none)
    uncut_s = torch.where(uncut, s, torch.full_like(s, float("-inf")))
    after = torch.logcumsumexp(uncut_s.flip(0), dim=0).flip(0)
    after = torch.cat([after[1:], after.new_full((1,), float("-inf"))])
    return (torch.logaddexp(s, after) - s).mean()


LOSSES = {"pairwise": pairwise_loss, "pointwise": pointwise_loss, "listwise": listwise_loss}
