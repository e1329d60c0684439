"""Serving latency figures of one run, defined once: the simulator's results and the real engine's
benchmark report the same keys computed the same way. numpy only (the engine benchmark imports it
before vLLM)."""

from __future__ import annotations

import numpy as np


def latency_summary(arrival, first_token, finish, output_tokens) -> dict[str, float]:
    """Per request: arrival, first-token and finish times (seconds) and answer tokens (each >= 1).
    Per-token latency is (finish - arrival) / answer tokens; throughput counts from the first
    arrival to the last finish."""
    arrival, first_token, finish = (np.asarray(x, dtype=np.float64) for x in (arrival, first_token, finish))
    tokens = np.asarray(output_tokens, dtype=np.float64)
    e2e, ttft = finish - arrival, first_token - arrival
    per_token = e2e / tokens
    span = float(finish.max() - arrival.min())
    return {
        "requests": int(tokens.size),
        "mean_per_token_latency": float(per_token.mean()),
        "p50_per_token_latency": float(np.percentile(per_token, 50)),
        "p90_per_token_latency": float(np.percentile(per_token, 90)),
        "p99_per_token_latency": float(np.percentile(per_token, 99)),
        "mean_ttft": float(ttft.mean()),
        "p90_ttft": float(np.percentile(ttft, 90)),
        "mean_e2e_latency": float(e2e.mean()),
        "p90_e2e_latency": float(np.percentile(e2e, 90)),
        "throughput_rps": float(tokens.size / span) if span > 0 else float("nan"),
        "throughput_tokens_per_s": float(tokens.sum() / span) if span > 0 else float("nan"),
        "makespan_s": span,
    }
