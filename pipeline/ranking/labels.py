"""Length labels and the δ pair filter: the rules every stage that compares answer lengths shares.

A prompt's length is the mean `output_tokens` over its samples. An answer cut at max_tokens
(finish_reason == "length") makes that mean a lower bound: the true length is at least the observed
one. So a truncated prompt may be the *longer* member of a pair (its true length is larger still: the
order holds and the relative gap only grows, so the δ test stays passed) but never the *shorter* one
(its true length could exceed its partner's and flip the pair).

Used by the pairs stage (sampling), training (in-batch pairs) and evaluation (pair accuracy).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.contracts import FINISH_REASONS


def keep_mask(la, lb, ta, tb, delta: float) -> np.ndarray:
    """The pair filter, vectorised: δ test on the labels plus the truncation rule (module doc)."""
    la, lb = np.asarray(la, dtype=np.float64), np.asarray(lb, dtype=np.float64)
    ta, tb = np.asarray(ta, dtype=bool), np.asarray(tb, dtype=bool)
    big = np.maximum(la, lb)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(big > 0, np.abs(la - lb) / np.where(big > 0, big, 1.0), 0.0)
    shorter_truncated = np.where(la < lb, ta, tb)
    return (rel >= delta) & (big > 0) & ~shorter_truncated


def in_batch_pairs(lengths, truncated, delta: float, groups=None) -> np.ndarray:
    """All pairs (i < j) among a batch of prompts that `keep_mask` keeps, as an (m, 2) int array.
    With `groups` (one id per prompt: the model whose answers gave its label), only prompts of the
    same group are compared: lengths of different models are not on one scale."""
    n = len(lengths)
    i, j = np.triu_indices(n, k=1)
    lengths, truncated = np.asarray(lengths), np.asarray(truncated)
    keep = keep_mask(lengths[i], lengths[j], truncated[i], truncated[j], delta)
    if groups is not None:
        groups = np.asarray(groups)
        keep &= groups[i] == groups[j]
    return np.stack([i[keep], j[keep]], axis=1).astype(np.int64)


def check_generations(generations: pd.DataFrame, where: str = "generations") -> None:
    """What every reader of answer lengths needs of a generations table (pairs, evaluate, lengths):
    rows, a prompt_id on each, output_tokens present and >= 0, reasoning_tokens within [0, output_tokens]
    and prompt_tokens >= 0 (where the table has them), a known finish_reason, no duplicate (prompt_id, sample). Anything else raises ValueError naming `where`, never a wrong number."""
    if generations.empty:
        raise ValueError(f"{where} has no rows: no answers to take lengths from")
    if generations["prompt_id"].isna().any():
        raise ValueError(f"{where}: {int(generations['prompt_id'].isna().sum())} row(s) have no prompt_id")
    tokens = generations["output_tokens"]
    if tokens.isna().any():
        raise ValueError(f"{where}: {int(tokens.isna().sum())} row(s) have no output_tokens")
    if (tokens < 0).any():
        raise ValueError(f"{where}: negative output_tokens in {int((tokens < 0).sum())} row(s)")
    # reasoning tokens are part of the output; a count outside [0, output_tokens] is a broken row
    # that `pars lengths` would average into a silent wrong figure
    if "reasoning_tokens" in generations:
        reasoning = generations["reasoning_tokens"]
        odd = reasoning.isna() | (reasoning < 0) | (reasoning > tokens)
        if odd.any():
            raise ValueError(
                f"{where}: reasoning_tokens missing or outside [0, output_tokens] in {int(odd.sum())} row(s)"
            )
    if "prompt_tokens" in generations:
        odd = generations["prompt_tokens"].isna() | (generations["prompt_tokens"] < 0)
        if odd.any():
            raise ValueError(f"{where}: prompt_tokens missing or negative in {int(odd.sum())} row(s)")
    bad = sorted(set(generations["finish_reason"].dropna()) - set(FINISH_REASONS))
    if bad or generations["finish_reason"].isna().any():
        raise ValueError(f"{where}: finish_reason must be one of {FINISH_REASONS}, found {bad or [None]}")
    dup = generations.duplicated(["prompt_id", "sample"])
    if dup.any():
        raise ValueError(f"{where}: {int(dup.sum())} duplicate (prompt_id, sample) row(s)")


def check_known_prompts(prompt_ids: pd.Series, known: pd.Series, where: str = "generations") -> None:
    """Every prompt_id must be in the prompts table (`known`): answers to prompts that `prepare` no
    longer makes belong to no split or dataset, and would be counted silently."""
    unknown = ~prompt_ids.isin(known)
    if unknown.any():
        raise ValueError(
            f"{where}: {int(prompt_ids[unknown].nunique())} prompt_id(s) are not in the prompts table "
            f"(e.g. {prompt_ids[unknown].iloc[0]!r}); stale generations? (run `pars generate` again)"
        )


def prompt_labels(generations: pd.DataFrame, where: str = "generations") -> pd.DataFrame:
    """Per prompt: mean output_tokens, whether any sample was truncated, number of samples."""
    check_generations(generations, where)
    g = generations.assign(truncated=generations["finish_reason"].eq("length"))
    out = g.groupby("prompt_id", sort=True).agg(
        length=("output_tokens", "mean"), truncated=("truncated", "any"), n_samples=("sample", "size")
    )
    out = out.reset_index()
    out["length"] = out["length"].astype(np.float64)
    out["n_samples"] = out["n_samples"].astype(np.int32)
    return out
