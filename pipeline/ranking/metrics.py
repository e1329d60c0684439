"""Ranking metrics, one place each: Kendall tau_b, its paired bootstrap, pair accuracy on
delta-filtered pairs, per-prompt length labels, and the between-sample noise ceiling.

Plain numpy/scipy/pandas (no torch): evaluate uses them, and so can training's validation.
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
    out = np.empty(len(indices))
    for i, idx in enumerate(indices):
        out[i] = kendall_tau_b(x[idx], y[idx])
    return out


def percentile_ci(boot: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of a bootstrap distribution (NaN resamples ignored)."""
    boot = np.asarray(boot, dtype=float)
    boot = boot[~np.isnan(boot)]
    if len(boot) == 0:
        return float("nan"), float("nan")
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(boot, [alpha, 1.0 - alpha])
    return float(low), float(high)


def tau_with_ci(x, y, *, n_boot: int = 1000, seed: int = 42, level: float = 0.95) -> dict:
    """tau_b of x against y with a percentile bootstrap interval over items (prompts)."""
    tau = kendall_tau_b(x, y)
    boot = bootstrap_taus(x, y, bootstrap_indices(len(x), n_boot, seed)) if len(x) >= 2 else np.array([])
    low, high = percentile_ci(boot, level)
    return {"kendall_tau_b": tau, "ci_low": low, "ci_high": high, "n_prompts": int(len(x)), "_boot": boot}


def answer_lengths(generations: pd.DataFrame) -> pd.DataFrame:
    """Per-prompt length label: mean `output_tokens` over samples (the label the pairs are built on).

    `truncated` is True when any sample stopped at max_tokens: the mean is then a lower bound."""
    g = generations.groupby("prompt_id", sort=True)
    return pd.DataFrame(
        {
            "length": g["output_tokens"].mean().astype(float),
            "truncated": g["finish_reason"].agg(lambda s: bool((s == "length").any())),
            "n_samples": g["sample"].nunique(),
        }
    )


def pair_accuracy(scores, lengths, truncated=None, *, delta: float = 0.2) -> tuple[float, int]:
    """Fraction of delta-filtered pairs whose scores order them as their lengths do.

    Pairs are all (i, j) with |l_i - l_j| / max(l_i, l_j) >= delta (the training filter).
    A pair whose shorter side is a lower bound (truncated) is dropped: its true order is unknown.
    Equal scores count one half. Returns (accuracy, number of pairs); NaN when there is none."""
    s = np.asarray(scores, dtype=float)
    l = np.asarray(lengths, dtype=float)
    t = np.zeros(len(l), dtype=bool) if truncated is None else np.asarray(truncated, dtype=bool)
    i, j = np.triu_indices(len(l), k=1)
    li, lj = l[i], l[j]
    biggest = np.maximum(np.maximum(li, lj), 1e-12)  # two zero-length answers: no pair
    keep = np.abs(li - lj) / biggest >= delta
    shorter_truncated = np.where(li < lj, t[i], t[j])
    keep &= ~shorter_truncated
    if not keep.any():
        return float("nan"), 0
    sign_len = np.sign(li[keep] - lj[keep])
    sign_score = np.sign(s[i][keep] - s[j][keep])
    correct = np.where(sign_score == 0, 0.5, (sign_score == sign_len).astype(float))
    return float(correct.mean()), int(keep.sum())


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
    taus, boots = [], []
    for a, b in combinations(range(samples.shape[1]), 2):
        x, y = samples[:, a], samples[:, b]
        ok = ~(np.isnan(x) | np.isnan(y))
        if ok.sum() < 2:
            continue
        # NaN-missing prompts are kept in the resample positions but excluded per pair
        xs, ys = np.where(ok, x, np.nan), np.where(ok, y, np.nan)
        taus.append(kendall_tau_b(x[ok], y[ok]))
        boots.append([_tau_nan(xs[r], ys[r]) for r in idx])
    if not taus:
        return None
    with warnings.catch_warnings():  # a resample where every pair is degenerate stays NaN, silently
        warnings.simplefilter("ignore", RuntimeWarning)
        boot = np.nanmean(np.asarray(boots), axis=0)
    low, high = percentile_ci(boot, level)
    return {"kendall_tau_b": float(np.mean(taus)), "ci_low": low, "ci_high": high, "n_prompts": int(n),
            "n_sample_pairs": len(taus), "_boot": boot}


def _tau_nan(x: np.ndarray, y: np.ndarray) -> float:
    ok = ~(np.isnan(x) | np.isnan(y))
    return kendall_tau_b(x[ok], y[ok])
