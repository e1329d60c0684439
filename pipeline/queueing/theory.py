"""KV-cache queueing theory (source document 003): g(s, o), the stable service rate mu, the
stability margin delta, a verdict for an arrival rate, and the replicas a load needs.

Notation (document 003): a request has prompt s and answer o (tokens). The prompt is processed in
chunks of s_hat tokens, memory growing to k*s_hat after chunk k; each decode step then adds one
token of KV cache, so decode step j holds s + j tokens. g(s, o) is the memory *area* of the
request over its life (token-steps):

    g(s, o) = sum_{k=1}^{s/s_hat} k*s_hat + sum_{j=1}^{o} (s + j)

    mu    = M / (b_bar * E[g(s, o)])          (requests per second; b_bar = seconds per step)
    delta = ess sup(s + o) / M
    lambda > mu             -> unstable (queue grows without bound)
    lambda < mu * (1-delta) -> stable (positive recurrent)
    otherwise               -> undecided by the theorems.

An engine also caps the requests it runs at once (max_num_seqs). Given that cap, a replica's
capacity is min(mu, slot_rate), slot_rate = max_num_seqs / (b_bar * E[steps per request]) (Little's
law): with short requests the batch slots saturate before the KV memory does, and the verdict and
the replica counts use the tighter bound (`Capacity.limit`, `Capacity.safe_below`).

When s_hat does not divide s, the last chunk is partial: memory after chunk k is min(k*s_hat, s),
k = 1..ceil(s/s_hat). This is what a chunked-prefill engine does and reduces to the document's
sum exactly when s_hat divides s (tests check both).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

STABLE, UNSTABLE, UNDECIDED = "stable", "unstable", "undecided"


def engine_shape_problem(M: int, token_budget: int, max_num_seqs: int, block_size: int) -> str | None:
    """What makes an engine shape unusable, or None; each caller names its own keys before it.
    Every running request decodes a token each step (vLLM refuses a smaller budget too), and the KV
    cache must hold at least one whole block."""
    if token_budget < max_num_seqs:
        return f"token_budget {token_budget} is below max_num_seqs {max_num_seqs}: each running request takes a token of the budget every step"
    if block_size > M:
        return f"block_size {block_size} exceeds M {M}: the KV cache would hold no whole block"
    return None


def fits_in_cache(tokens: int, M: int, block_size: int) -> bool:
    """Whether a request of `tokens` (prompt + answer) fits in the KV cache: whole blocks of M."""
    return -(-tokens // block_size) <= M // block_size


def prefill_area(s, chunk: int):
    """sum_{k=1}^{ceil(s/chunk)} min(k*chunk, s): memory area of the chunked prefill phase."""
    s = np.asarray(s, dtype=np.int64)
    n = -(-s // chunk)  # number of chunks, ceil
    # full chunks 1..n-1 hold k*chunk each; the last holds all s tokens
    full = n - 1
    return chunk * full * (full + 1) // 2 + s * (n > 0)


def decode_area(s, o):
    """sum_{j=1}^{o} (s + j) = o*s + o(o+1)/2: memory area of the decode phase."""
    s = np.asarray(s, dtype=np.int64)
    o = np.asarray(o, dtype=np.int64)
    return o * s + o * (o + 1) // 2


def g(s, o, chunk: int):
    """Lifetime memory area g(s, o) in token-steps (vectorised over numpy arrays)."""
    return prefill_area(s, chunk) + decode_area(s, o)


# ---------------------------------------------------------------- length distributions


@dataclass(frozen=True)
class Workload:
    """A joint (s, o) distribution: either independent discrete uniforms U(lo, hi) on integers,
    a mixture of such workloads, or an empirical sample of (s, o) pairs."""

    name: str
    s_range: tuple[int, int] | None = None
    o_range: tuple[int, int] | None = None
    mixture: tuple["Workload", ...] | None = None
    s_sample: np.ndarray | None = None
    o_sample: np.ndarray | None = None

    @staticmethod
    def uniform(name: str, s_lo: int, s_hi: int, o_lo: int, o_hi: int) -> "Workload":
        return Workload(name, s_range=(int(s_lo), int(s_hi)), o_range=(int(o_lo), int(o_hi)))

    @staticmethod
    def empirical(name: str, s, o) -> "Workload":
        s = np.asarray(s, dtype=np.int64)
        o = np.asarray(o, dtype=np.int64)
        if s.shape != o.shape or s.size == 0:
            raise ValueError(f"workload {name}: need equally long, non-empty s and o samples")
        if (s < 1).any() or (o < 1).any():
            raise ValueError(f"workload {name}: prompt and answer lengths must be >= 1 token")
        return Workload(name, s_sample=s, o_sample=o)

    @staticmethod
    def mix(name: str, *parts: "Workload") -> "Workload":
        return Workload(name, mixture=tuple(parts))

    def expected_g(self, chunk: int) -> float:
        """E[g(s, o)], exact for uniforms (s and o independent) and mixtures, the sample mean
        for an empirical workload."""
        if self.mixture:
            return float(np.mean([p.expected_g(chunk) for p in self.mixture]))
        if self.s_sample is not None:
            return float(np.mean(g(self.s_sample, self.o_sample, chunk)))
        s = np.arange(self.s_range[0], self.s_range[1] + 1, dtype=np.int64)
        o = np.arange(self.o_range[0], self.o_range[1] + 1, dtype=np.int64)
        # g = C(s) + o*s + o(o+1)/2 and s, o independent, so the expectation splits exactly
        return float(prefill_area(s, chunk).mean() + o.mean() * s.mean() + (o * (o + 1) / 2).mean())

    def ess_sup(self) -> int:
        """ess sup(s + o): the largest request the workload can produce."""
        if self.mixture:
            return max(p.ess_sup() for p in self.mixture)
        if self.s_sample is not None:
            return int((self.s_sample + self.o_sample).max())
        return self.s_range[1] + self.o_range[1]

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n (s, o) draws."""
        if self.mixture:
            which = rng.integers(0, len(self.mixture), size=n)
            s = np.empty(n, dtype=np.int64)
            o = np.empty(n, dtype=np.int64)
            for i, part in enumerate(self.mixture):
                idx = np.flatnonzero(which == i)
                s[idx], o[idx] = part.sample(idx.size, rng)
            return s, o
        if self.s_sample is not None:
            idx = rng.integers(0, self.s_sample.size, size=n)
            return self.s_sample[idx].copy(), self.o_sample[idx].copy()
        s = rng.integers(self.s_range[0], self.s_range[1] + 1, size=n)
        o = rng.integers(self.o_range[0], self.o_range[1] + 1, size=n)
        return s.astype(np.int64), o.astype(np.int64)

    def describe(self) -> str:
        if self.mixture:
            return "mixture of " + ", ".join(p.describe() for p in self.mixture)
        if self.s_sample is not None:
            return f"empirical sample of {self.s_sample.size} requests"
        return f"s ~ U({self.s_range[0]},{self.s_range[1]}), o ~ U({self.o_range[0]},{self.o_range[1]})"


def document_workloads() -> dict[str, Workload]:
    """The validation workloads of document 003: P/D ratios 1:1, 2:1, 1:2, and a mix of them
    (the document's fourth set is LongBench v2, which is not available offline; a mixture of
    the three ratios stands in for a heterogeneous real workload)."""
    w11 = Workload.uniform("1:1", 10, 1600, 10, 1600)
    w21 = Workload.uniform("2:1", 10, 2133, 10, 1066)
    w12 = Workload.uniform("1:2", 10, 1066, 10, 2133)
    return {"1:1": w11, "2:1": w21, "1:2": w12, "mixed": Workload.mix("mixed", w11, w21, w12)}


def parse_distribution(spec: str) -> tuple[int, int]:
    """'uniform:10:1600' or '10:1600' -> (10, 1600)."""
    parts = spec.split(":")
    if parts[0] == "uniform":
        parts = parts[1:]
    if len(parts) != 2:
        raise ValueError(f"length distribution {spec!r}: expected 'uniform:LO:HI'")
    lo, hi = int(parts[0]), int(parts[1])
    if not 1 <= lo <= hi:
        raise ValueError(f"length distribution {spec!r}: need 1 <= LO <= HI")
    return lo, hi


def parse_lengths(spec: Any, name: str, max_tokens: int) -> tuple[int, int]:
    """`uniform:LO:HI` (or `LO:HI`) token lengths with 1 <= LO <= HI <= max_tokens, or one PARSError line
    naming `name` (the flag or params key the spec came from)."""
    from pipeline.errors import PARSError

    try:
        lo, hi = parse_distribution(spec if isinstance(spec, str) else "")
    except ValueError:
        # YAML 1.1 reads an unquoted 16:48 as the sexagesimal number 1008
        hint = "; quote it in YAML" if isinstance(spec, int) and not isinstance(spec, bool) else ""
        raise PARSError(
            f"{name} {spec!r}: expected uniform:LO:HI (or LO:HI) with whole numbers 1 <= LO <= HI{hint}"
        ) from None
    if hi > max_tokens:  # the length table would take gigabytes; no engine takes such a request
        raise PARSError(f"{name} {spec!r}: HI {hi:,} is more than {max_tokens:,} tokens")
    return lo, hi


# ---------------------------------------------------------------- the theorems


@dataclass(frozen=True)
class Capacity:
    M: int
    chunk: int
    step_time: float
    expected_g: float
    mu: float
    delta: float
    stable_below: float  # mu * (1 - delta)
    max_num_seqs: int | None = None  # the engine's cap on running requests; None: memory alone binds
    slot_rate: float | None = None  # max_num_seqs / (b_bar * E[steps per request])

    @property
    def limit(self) -> float:
        """The most requests/s one replica sustains: mu, or the slot rate where that is lower."""
        return self.mu if self.slot_rate is None else min(self.mu, self.slot_rate)

    @property
    def safe_below(self) -> float:
        """Rates below this are stable: below mu(1-delta) (the theorem) and below the slot rate."""
        return self.stable_below if self.slot_rate is None else min(self.stable_below, self.slot_rate)

    @property
    def bound_by(self) -> str:
        return "batch slots" if self.slot_rate is not None and self.slot_rate < self.mu else "KV memory"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "limit": self.limit, "safe_below": self.safe_below, "bound_by": self.bound_by}


def service_rate(M: int, step_time: float, expected_g: float) -> float:
    """mu = M / (b_bar * E[g])  (requests per second)."""
    if M <= 0 or step_time <= 0 or expected_g <= 0:
        raise ValueError("M, step time and E[g] must be positive")
    return M / (step_time * expected_g)


def capacity(workload: Workload, M: int, chunk: int, step_time: float, max_num_seqs: int | None = None) -> Capacity:
    """mu and delta of the document's theorems; with `max_num_seqs`, also the batch-slot rate."""
    eg = workload.expected_g(chunk)
    mu = service_rate(M, step_time, eg)
    delta = workload.ess_sup() / M
    if delta >= 1:
        # a single request larger than the whole KV cache can never be served
        raise ValueError(
            f"workload {workload.name}: largest request ({workload.ess_sup()} tokens) "
            f"does not fit in M = {M} tokens"
        )
    if max_num_seqs is not None and max_num_seqs < 1:
        raise ValueError("max_num_seqs must be >= 1")
    return Capacity(
        M=M,
        chunk=chunk,
        step_time=step_time,
        expected_g=eg,
        mu=mu,
        delta=delta,
        stable_below=mu * (1 - delta),
        max_num_seqs=max_num_seqs,
        slot_rate=None if max_num_seqs is None else slot_rate(workload, max_num_seqs, chunk, step_time),
    )


def verdict(rate: float, cap: Capacity) -> str:
    """The theorems' verdict for arrival rate `rate` (requests per second); at or above the slot
    rate the batch slots cannot keep up (Little's law), whatever the memory allows."""
    if rate > cap.mu or (cap.slot_rate is not None and rate >= cap.slot_rate):
        return UNSTABLE
    if rate < cap.safe_below:
        return STABLE
    return UNDECIDED


def slot_rate(workload: Workload, max_num_seqs: int, chunk: int, step_time: float) -> float:
    """max_num_seqs / (b_bar * E[steps per request]): the rate at which the batch slots, not the
    KV memory, saturate (Little's law; a request occupies a slot for ceil(s/chunk) + o steps).
    The document's mu assumes memory binds; with short requests the slot limit can bind first,
    and min(mu, slot_rate) is then the real capacity."""
    if workload.mixture:
        steps = float(np.mean([_mean_steps(p, chunk) for p in workload.mixture]))
    else:
        steps = _mean_steps(workload, chunk)
    return max_num_seqs / (step_time * steps)


def _mean_steps(w: Workload, chunk: int) -> float:
    if w.s_sample is not None:
        return float(np.mean(-(-w.s_sample // chunk) + w.o_sample))
    s = np.arange(w.s_range[0], w.s_range[1] + 1)
    o = np.arange(w.o_range[0], w.o_range[1] + 1)
    return float(np.mean(-(-s // chunk)) + o.mean())


def replicas_needed(rate: float, cap: Capacity, margin: float = 0.1) -> dict[str, Any]:
    """Data-parallel replicas for `rate`, each getting rate/n of the load.

    `guaranteed` is the fewest replicas for which the stability theorem holds with the safety
    margin (each replica loaded to at most (1 - margin) * mu * (1 - delta), and to that share of the
    slot rate); `minimum` is the fewest for which the load is not already ruled out (rate/n <= mu
    and below the slot rate)."""
    if not 0 <= margin < 1:
        raise ValueError("margin must be in [0, 1)")
    if rate < 0:
        raise ValueError("arrival rate must be >= 0")
    guaranteed = max(1, math.ceil(rate / ((1 - margin) * cap.safe_below) - 1e-12))
    if rate / guaranteed >= cap.safe_below:  # margin 0, a rate that is a multiple of it: the bound is strict
        guaranteed += 1
    minimum = max(1, math.ceil(rate / cap.limit - 1e-12))
    if cap.slot_rate is not None and rate / minimum >= cap.slot_rate:  # exactly at the slot rate
        minimum += 1
    return {
        "rate": rate,
        "margin": margin,
        "minimum": minimum,
        "guaranteed": guaranteed,
        "per_replica_rate": rate / guaranteed,
        "utilisation": rate / (guaranteed * cap.limit),
        "bound_by": cap.bound_by,
    }


def fit_step_time(seconds, tokens) -> dict[str, Any]:
    """The simulator's step model from a real engine's steps: least squares step time = c0 + c1 *
    tokens over the steps that scheduled work, clamped to c0 > 0, c1 >= 0; r2 of the clamped model."""
    seconds, tokens = np.asarray(seconds, dtype=float), np.asarray(tokens, dtype=float)
    busy = tokens > 0
    st, tok = seconds[busy], tokens[busy]
    if st.size < 3:
        return {"c0_s": float(st.mean()) if st.size else None, "c1_s_per_token": 0.0, "r2": None, "steps": int(st.size)}
    c1, c0 = np.polyfit(tok, st, 1)
    c0, c1 = float(max(c0, 1e-6)), float(max(c1, 0.0))
    resid = st - (c0 + c1 * tok)
    return {
        "c0_s": c0,
        "c1_s_per_token": c1,
        # mean squared residual, not its variance: a clamped c0 leaves an offset var() would hide
        "r2": float(1 - np.mean(resid**2) / st.var()),
        "steps": int(st.size),
        "mean_step_s": float(st.mean()),
    }
