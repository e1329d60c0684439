"""The three training objectives, as small plain functions with one shared signature:

    loss(scores, lengths, pairs) -> scalar tensor

`scores` (n,) are the model's outputs for the n prompts of a batch (higher = longer answer),
`lengths` (n,) their label lengths (mean output tokens), and `pairs` (m, 2) a LongTensor of
index pairs (i, j) into the batch that the pairwise loss compares (label y = sign(len_i - len_j)).
Pointwise and listwise use every prompt of the batch and ignore `pairs`; keeping one signature
lets the LightningModule call any method the same way. No Lightning here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

METHODS = ("pairwise", "pointwise", "listwise")


def pairwise_loss(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    pairs: torch.Tensor,
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


def pointwise_loss(scores: torch.Tensor, lengths: torch.Tensor, pairs: torch.Tensor | None = None) -> torch.Tensor:
    """S3/SSJF family: mean squared error of the score against log(1 + length)."""
    target = torch.log1p(lengths.to(scores.dtype))
    return F.mse_loss(scores, target)


def listwise_loss(scores: torch.Tensor, lengths: torch.Tensor, pairs: torch.Tensor | None = None) -> torch.Tensor:
    """vllm-ltr family: ListMLE, the batch being one list ordered by length (longest first).

    -log P(order) = sum_k [ logsumexp(s_{pi(k..n)}) - s_{pi(k)} ], divided by n so the scale
    (and hence the learning rate that suits it) does not depend on the batch size.
    """
    order = torch.argsort(lengths, descending=True, stable=True)
    s = scores[order]
    # logsumexp over each suffix s[k:], computed as a reversed cumulative logsumexp.
    suffix_lse = torch.logcumsumexp(s.flip(0), dim=0).flip(0)
    return (suffix_lse - s).mean()


LOSSES = {"pairwise": pairwise_loss, "pointwise": pointwise_loss, "listwise": listwise_loss}
