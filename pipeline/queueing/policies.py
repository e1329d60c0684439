"""Queue policies as per-request keys for the simulator (lower key = served first; ties FCFS).

Learned predictors give scores with higher = longer answer (pipeline.serving.scorer), so the
shortest-predicted-first order is ascending score. Oracle SJF uses the true answer length."""

from __future__ import annotations

import numpy as np

POLICIES = ("fcfs", "pars", "pointwise", "listwise", "oracle", "random")
# score-based policies and the evaluate stage's `method` they read
SCORE_METHODS = {"pars": "pairwise", "pointwise": "pointwise", "listwise": "listwise"}


def on_pars_scheduler(policy: str) -> bool:
    """Whether the engine serves `policy` with the PARS scheduler (which keeps `running` in key order,
    the simulator's `sort_running`): every policy but FCFS, which is vLLM's own scheduler."""
    return policy != "fcfs"


def policy_key(
    policy: str,
    arrival: np.ndarray,
    o: np.ndarray,
    scores: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    arrival = np.asarray(arrival, dtype=np.float64)
    if policy == "fcfs":
        return arrival.copy()
    if policy == "oracle":
        return np.asarray(o, dtype=np.float64)
    if policy == "random":
        rng = rng or np.random.default_rng(0)
        return rng.random(arrival.size)
    if policy in SCORE_METHODS:
        if scores is None:
            raise ValueError(f"policy {policy!r} needs predictor scores")
        scores = np.asarray(scores, dtype=np.float64)
        if scores.shape != arrival.shape or not np.isfinite(scores).all():
            raise ValueError(f"policy {policy!r}: need one finite score per request")
        return scores
    raise ValueError(f"unknown policy {policy!r}; known: {POLICIES}")
