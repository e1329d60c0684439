"""Ranking metrics, one place each: Kendall tau_b, its paired bootstrap, pair accuracy on
delta-filtered pairs, Harrell's C (concordance on the pairs whose order censoring leaves known)
and the between-sample noise ceiling.

Plain numpy/scipy/pandas (no torch): evaluate uses them, and so can training's validation.
Length labels and the pair filter are `pipeline.ranking.labels`', not redefined here.
"""

from __future__ import annotations

import warnings
from itertools import combinations

import numpy as np
import pandas as pd
from scipy.stats import kendalltau


def kendall_tau_b(x, y) -> float:
    """Kendall tau_b (ties corrected); NaN when fewer than two items or either side is constant."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_b: lengths differ ({len(x)} vs {len(y)})")
    if len(x) < 2:
        return float("nan")
    return float(kendalltau(x, y, variant="b").statistic)


def bootstrap_indices(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) prompt indices drawn with replacement.

    A pure function of (n, n_boot, seed): every statistic computed on the same prompts with the
    same seed sees the same resamples, so differences between them are *paired* bootstraps."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, size=(n_boot, n))


def bootstrap_taus(x, y, indices: np.ndarray) -> np.ndarray:
    """tau_b on each bootstrap resample (rows of `indices`); degenerate resamples give NaN."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) > _MATRIX_MAX_N:  # the pair matrices would be too big: one scipy call a resample
        return np.array([kendall_tau_b(x[idx], y[idx]) for idx in indices])
    return weighted_taus(x, y, resample_counts(indices, len(x)))


# Above this many prompts, bootstrap with scipy per resample instead of (n, n) pair matrices.
_MATRIX_MAX_N = 2000


def resample_counts(indices: np.ndarray, n: int) -> np.ndarray:
    """(n_boot, n) multiplicity of each item in each resample."""
    b = len(indices)
    flat = (indices + np.arange(b)[:, None] * n).ravel()
    return np.bincount(flat, minlength=b * n).reshape(b, n).astype(float)


def weighted_taus(x: np.ndarray, y: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """tau_b of each multiset {item i repeated counts[r, i] times}, all resamples in a few matmuls.

    The same numbers as scipy on the expanded resample (a copy of an item is a pair tied in both
    x and y), at about 1000x the speed of one scipy call per resample:
      P  = sum_{i<j} w_i w_j sgn(x_i-x_j) sgn(y_i-y_j) = w' (Sx*Sy) w / 2
      n1 = pairs tied in x = (w' Tx w - sum w) / 2 (Tx_ij = [x_i == x_j], diagonal included)
      tau_b = P / sqrt((n0 - n1)(n0 - n2)), n0 = N(N-1)/2."""
    sx = np.sign(x[:, None] - x[None, :])
    sy = np.sign(y[:, None] - y[None, :])
    w = counts
    quad = lambda a: np.einsum("bi,bi->b", w @ a, w)  # noqa: E731  (w_r' A w_r for every row r)
    total = w.sum(axis=1)
    n0 = total * (total - 1) / 2
    n1 = (quad((sx == 0).astype(float)) - total) / 2
    n2 = (quad((sy == 0).astype(float)) - total) / 2
    p = quad(sx * sy) / 2
    denom = (n0 - n1) * (n0 - n2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, p / np.sqrt(np.where(denom > 0, denom, 1.0)), np.nan)


def percentile_ci(boot: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of a bootstrap distribution (NaN resamples ignored)."""
    boot = np.asarray(boot, dtype=float)
    boot = boot[~np.isnan(boot)]
    if len(boot) == 0:
        return float("nan"), float("nan")
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(boot, [alpha, 1.0 - alpha])
    return float(low), float(high)


def pair_accuracy(scores, lengths, pairs) -> float:
    """Fraction of pairs (i, j) (an (m, 2) index array) whose scores order them as their lengths do.
    Equal scores count one half; NaN when there is no pair."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if len(pairs) == 0:
        return float("nan")
    return float(_pair_agreement(np.asarray(scores, dtype=float), np.asarray(lengths, dtype=float), pairs).mean())


def _pair_agreement(scores: np.ndarray, lengths: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Per pair: 1 if the scores order it as the lengths do, 1/2 on equal scores, else 0."""
    i, j = pairs[:, 0], pairs[:, 1]
    sign_score = np.sign(scores[i] - scores[j])
    return np.where(sign_score == 0, 0.5, (sign_score == np.sign(lengths[i] - lengths[j])).astype(float))


def delta_pair_accuracy(
    scores, lengths, truncated=None, *, delta: float = 0.2, chunk_pairs: int = 1 << 22
) -> tuple[float, int]:
    """`pair_accuracy` on every pair the training filter keeps (`pipeline.ranking.labels.keep_mask`:
    relative length gap >= delta, and not when the shorter side is a truncated lower bound).
    Returns (accuracy, number of pairs).

    The n(n-1)/2 candidate pairs are visited in blocks of rows (about `chunk_pairs` at a time), so
    memory stays flat for tens of thousands of prompts; each pair scores 0, 1/2 or 1, so the block
    sums are exact and the result equals the mean over one array of every kept pair."""
    from pipeline.ranking.labels import keep_mask

    s = np.asarray(scores, dtype=float)
    lens = np.asarray(lengths, dtype=float)
    t = np.zeros(len(lens), dtype=bool) if truncated is None else np.asarray(truncated, dtype=bool)
    n = len(lens)
    right, kept = 0.0, 0
    rows = max(1, int(chunk_pairs) // max(n, 1))
    for start in range(0, n, rows):
        first = np.arange(start, min(start + rows, n))
        i, j = np.nonzero(np.arange(n)[None, :] > first[:, None])  # j > i: each unordered pair once
        i = i + start
        keep = keep_mask(lens[i], lens[j], t[i], t[j], delta)
        pairs = np.stack([i[keep], j[keep]], axis=1)
        right += float(_pair_agreement(s, lens, pairs).sum())
        kept += len(pairs)
    return (right / kept if kept else float("nan")), kept


def harrell_c(labels, scores, censored) -> tuple[float, int]:
    """Harrell's C of `scores` against length `labels` where `censored` labels are lower bounds
    (an answer cut at max_tokens). Returns (C, number of comparable pairs); C is NaN without any.

    A pair is comparable when its labels differ and the shorter member is uncensored: the rule of
    `pipeline.ranking.labels` without the delta gap (a censored longer member only grows, so its
    order is known; a censored shorter one might overtake its partner). Over comparable pairs,
    C = (concordant + 0.5 * score-tied) / comparable. Without censoring or ties (label or score)
    it is (1 + tau_b) / 2; tau_b instead ranks cut lengths as exact and mixes in pairs of unknown order."""
    n = len(np.asarray(labels))
    agree, comparable = _harrell_sums(labels, scores, censored, np.ones((1, n)))
    return (float(agree[0] / comparable[0]) if comparable[0] else float("nan")), int(comparable[0])


def bootstrap_harrell_c(labels, scores, censored, indices: np.ndarray) -> np.ndarray:
    """`harrell_c` on each bootstrap resample (rows of `indices`, as `bootstrap_taus`); NaN where a
    resample has no comparable pair."""
    agree, comparable = _harrell_sums(labels, scores, censored, resample_counts(indices, len(np.asarray(labels))))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(comparable > 0, agree / np.where(comparable > 0, comparable, 1.0), np.nan)


def _harrell_sums(labels, scores, censored, weights: np.ndarray, block_cells: int = 1 << 22):
    """Per row r of `weights` (an item's multiplicity): (sum of w_i w_j * agreement, sum of w_i w_j)
    over comparable pairs (i shorter, j longer), each pair once. Copies of one item tie in label, so
    are never comparable: the sums equal `harrell_c`'s counts on the expanded multiset. Visited in
    blocks of rows of the (n, n) pair matrix, so memory stays flat."""
    y = np.asarray(labels, dtype=float)
    s = np.asarray(scores, dtype=float)
    cut = np.asarray(censored, dtype=bool)
    if not len(y) == len(s) == len(cut):
        raise ValueError(f"harrell_c: lengths differ ({len(y)}, {len(s)}, {len(cut)})")
    w = np.asarray(weights, dtype=float)
    n = len(y)
    agree, comparable = np.zeros(len(w)), np.zeros(len(w))
    rows = max(1, block_cells // max(n, 1))
    for start in range(0, n, rows):
        i = slice(start, min(start + rows, n))
        shorter = (y[i, None] < y[None, :]) & ~cut[i, None]  # row i is the shorter member, known
        ds = s[i, None] - s[None, :]
        credit = np.where(ds == 0, 0.5, (ds < 0).astype(float)) * shorter  # a lower score for the shorter
        agree += np.einsum("bi,bi->b", w[:, i] @ credit, w)
        comparable += np.einsum("bi,bi->b", w[:, i] @ shorter.astype(float), w)
    return agree, comparable


def sample_length_matrix(generations: pd.DataFrame, prompt_ids) -> np.ndarray:
    """(prompts, samples) output_tokens of the given prompts; NaN where a sample is missing."""
    wide = generations.pivot_table(index="prompt_id", columns="sample", values="output_tokens", aggfunc="first")
    return wide.reindex(list(prompt_ids)).to_numpy(dtype=float)


def noise_ceiling(samples: np.ndarray, *, n_boot: int = 1000, seed: int = 42, level: float = 0.95) -> dict | None:
    """tau_b between the lengths of two independent samples of the same prompts.

    Averaged over every pair of sample columns (k=4 gives 6 pairs), each on the prompts that have
    both samples; the interval bootstraps prompts (the same resamples for every pair). None when
    there are fewer than two samples per prompt."""
    samples = np.asarray(samples, dtype=float)
    if samples.ndim != 2 or samples.shape[1] < 2 or len(samples) < 2:
        return None
    n = len(samples)
    idx = bootstrap_indices(n, n_boot, seed)
    counts = resample_counts(idx, n) if n <= _MATRIX_MAX_N else None
    taus, boots = [], []
    for a, b in combinations(range(samples.shape[1]), 2):
        x, y = samples[:, a], samples[:, b]
        ok = ~(np.isnan(x) | np.isnan(y))  # a prompt missing either sample is left out of this pair
        if ok.sum() < 2:
            continue
        taus.append(kendall_tau_b(x[ok], y[ok]))
        if counts is not None:
            boots.append(weighted_taus(x[ok], y[ok], counts[:, ok]))
        else:
            boots.append([_tau_nan(x[r], y[r]) for r in idx])
    if not taus:
        return None
    with warnings.catch_warnings():  # a resample where every pair is degenerate stays NaN, silently
        warnings.simplefilter("ignore", RuntimeWarning)
        boot = np.nanmean(np.asarray(boots, dtype=float), axis=0)
    low, high = percentile_ci(boot, level)
    return {
        "kendall_tau_b": float(np.nanmean(taus)) if np.isfinite(taus).any() else float("nan"),
        "ci_low": low,
        "ci_high": high,
        "n_prompts": int(n),
        "n_sample_pairs": int(np.isfinite(taus).sum()),  # pairs with a tau_b (a constant column has none)
        "_boot": boot,
    }


def _tau_nan(x: np.ndarray, y: np.ndarray) -> float:
    ok = ~(np.isnan(x) | np.isnan(y))
    return kendall_tau_b(x[ok], y[ok])
