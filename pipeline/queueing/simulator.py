"""A KV-memory-bound serving simulator: the queueing model of document 003 run step by step,
with what vLLM's (V1) scheduler does.

Per step (one forward pass of the engine):
  1. running requests, in admission order, are scheduled first: a decoding request takes one
     token, a prefilling one a chunk of at most `chunk` tokens (and what is left of the step's
     token budget). KV for those tokens is allocated first; when memory runs out the
     lowest-priority running request is preempted (recompute: its KV is freed, it goes back to
     the waiting queue and later re-prefills prompt + the tokens generated so far);
  2. if nobody was preempted, waiting requests are admitted in policy order while the budget,
     `max_num_seqs` and memory for their first chunk allow; the first that does not fit stops
     admission (vLLM does not skip over the head);
  3. the step takes `c0 + c1 * tokens_in_step` seconds (c1 = 0: the constant b_bar of the
     theory; otherwise affine, fitted to an engine).

Memory follows the document: after prefill chunk k a request holds min(k*chunk, s) tokens, decode
step j holds s + j, freed at completion; with `block_size` > 1 memory is allocated in blocks
(as paged attention does) and M is rounded down to whole blocks. The first answer token is
emitted by the first decode step (the document's model: o decode steps for o tokens).

Speed: the loop is compiled with numba when it is importable (plain Python otherwise, fine for
tests and small runs). Stretches of pure decoding in which nothing can change the batch (no
arrival, no completion, no admission possible, no preemption) are skipped in one jump, and an
empty system jumps to the next arrival, so the cost is per event, not per step.

Queue order is a per-request key (lower = served first; ties by arrival). The starvation rule
promotes a request that has waited `starvation_s` seconds since arrival ahead of every
unpromoted one (promoted ones in arrival order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:  # numba ships with vLLM; without it the same code runs as plain Python (slowly)
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_NUMBA = False

    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda f: f


NOT_ARRIVED, WAITING, RUNNING, DONE = 0, 1, 2, 3
PROMOTED_BASE = -1e300  # a promoted request's key: ahead of all others; ties go by arrival (index)


# ---------------------------------------------------------------- a binary min-heap on arrays
# entries (key, idx, version); order by key, then idx (idx = arrival order: FCFS tie-break)


@njit(cache=True)
def _less(hk, hi, a, b):
    return hk[a] < hk[b] or (hk[a] == hk[b] and hi[a] < hi[b])


@njit(cache=True)
def _swap(hk, hi, hv, a, b):
    hk[a], hk[b] = hk[b], hk[a]
    hi[a], hi[b] = hi[b], hi[a]
    hv[a], hv[b] = hv[b], hv[a]


@njit(cache=True)
def _sift_up(hk, hi, hv, pos):
    while pos > 0:
        parent = (pos - 1) >> 1
        if _less(hk, hi, pos, parent):
            _swap(hk, hi, hv, pos, parent)
            pos = parent
        else:
            break


@njit(cache=True)
def _sift_down(hk, hi, hv, pos, size):
    while True:
        left = 2 * pos + 1
        if left >= size:
            break
        best = left
        if left + 1 < size and _less(hk, hi, left + 1, left):
            best = left + 1
        if _less(hk, hi, best, pos):
            _swap(hk, hi, hv, best, pos)
            pos = best
        else:
            break


@njit(cache=True)
def _heap_pop(hk, hi, hv, size):
    size -= 1
    if size > 0:
        hk[0], hi[0], hv[0] = hk[size], hi[size], hv[size]
        _sift_down(hk, hi, hv, 0, size)
    return size


@njit(cache=True)
def _heap_compact(hk, hi, hv, size, state, ver):
    """Drop stale entries (lazy deletion) and re-heapify; returns the new size."""
    j = 0
    for p in range(size):
        i = hi[p]
        if state[i] == 1 and hv[p] == ver[i]:
            hk[j], hi[j], hv[j] = hk[p], hi[p], hv[p]
            j += 1
    for p in range((j >> 1) - 1, -1, -1):
        _sift_down(hk, hi, hv, p, j)
    return j


# ---------------------------------------------------------------- the step loop


@njit(cache=True)
def _simulate(arrival, s, o, key, M_blocks, block, chunk, budget, max_seqs, c0, c1, starve,
              rec_cap, skip):
    n = arrival.shape[0]
    state = np.zeros(n, np.int8)
    ver = np.zeros(n, np.int64)
    key_cur = key.copy()
    gen = np.zeros(n, np.int64)  # answer tokens generated
    pre_done = np.zeros(n, np.int64)  # prefill tokens computed (of pre_target)
    pre_target = s.copy()  # prompt, plus generated tokens after a preemption
    kv = np.zeros(n, np.int64)  # KV tokens held
    blocks = np.zeros(n, np.int64)
    sched = np.zeros(n, np.int64)  # tokens scheduled this step
    first_tok = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    admitted = np.full(n, np.nan)
    n_preempt = np.zeros(n, np.int64)

    cap = 2 * n + 1024
    hk = np.empty(cap, np.float64)
    hi = np.empty(cap, np.int64)
    hv = np.empty(cap, np.int64)
    hsize = 0

    run = np.empty(max_seqs, np.int64)
    n_run = 0
    free = M_blocks
    kv_total = 0
    max_used = 0
    n_wait = 0
    next_arr = 0
    p_starve = 0
    done = 0
    t = 0.0
    steps = 0
    skipped = 0
    total_preempt = 0
    area = 0  # sum over steps of KV tokens held: the simulated counterpart of sum g(s, o)

    rec_t = np.empty(rec_cap, np.float64)
    rec_wait = np.empty(rec_cap, np.int64)
    rec_run = np.empty(rec_cap, np.int64)
    rec_kv = np.empty(rec_cap, np.int64)
    n_rec = 0
    stride = 1
    tick = 0

    while done < n:
        # ---- arrivals and starvation promotions up to time t
        while next_arr < n and arrival[next_arr] <= t:
            i = next_arr
            state[i] = 1
            n_wait += 1
            if hsize == cap:
                hsize = _heap_compact(hk, hi, hv, hsize, state, ver)
            hk[hsize], hi[hsize], hv[hsize] = key_cur[i], i, ver[i]
            hsize += 1
            _sift_up(hk, hi, hv, hsize - 1)
            next_arr += 1
        while p_starve < next_arr and arrival[p_starve] + starve <= t:
            i = p_starve
            key_cur[i] = PROMOTED_BASE
            if state[i] == 1:  # re-queue with the promoted key; the old entry goes stale
                ver[i] += 1
                if hsize == cap:
                    hsize = _heap_compact(hk, hi, hv, hsize, state, ver)
                hk[hsize], hi[hsize], hv[hsize] = key_cur[i], i, ver[i]
                hsize += 1
                _sift_up(hk, hi, hv, hsize - 1)
            p_starve += 1
        # drop stale heap tops so hi[0] is the real head
        while hsize > 0 and (state[hi[0]] != 1 or hv[0] != ver[hi[0]]):
            hsize = _heap_pop(hk, hi, hv, hsize)

        # ---- record (decimating by 2 whenever the buffer fills)
        if tick % stride == 0:
            if n_rec == rec_cap:
                for p in range(rec_cap // 2):
                    rec_t[p] = rec_t[2 * p]
                    rec_wait[p] = rec_wait[2 * p]
                    rec_run[p] = rec_run[2 * p]
                    rec_kv[p] = rec_kv[2 * p]
                n_rec = rec_cap // 2
                stride *= 2
            if tick % stride == 0:
                rec_t[n_rec] = t
                rec_wait[n_rec] = n_wait
                rec_run[n_rec] = n_run
                rec_kv[n_rec] = kv_total
                n_rec += 1
        tick += 1

        # ---- empty system: jump to the next arrival
        if n_run == 0 and hsize == 0:
            if next_arr < n:
                t = max(t, arrival[next_arr])
                continue
            break  # unreachable while done < n

        # ---- fast path: a stretch of pure decoding that nothing can interrupt
        all_decode = True
        for q in range(n_run):
            r = run[q]
            if pre_done[r] < pre_target[r]:
                all_decode = False
                break
        if skip and all_decode and n_run > 0 and n_run <= budget:
            blocked = True
            if hsize > 0 and n_run < max_seqs and budget - n_run > 0:
                h = hi[0]
                tok = min(chunk, pre_target[h] - pre_done[h], budget - n_run)
                if (tok + block - 1) // block <= free:
                    blocked = False
            if blocked:
                k = 1 << 62
                for q in range(n_run):
                    r = run[q]
                    k = min(k, o[r] - gen[r])
                dt = c0 + c1 * n_run
                if next_arr < n:
                    k = min(k, max(1, int(math.ceil((arrival[next_arr] - t) / dt))))
                if p_starve < next_arr and starve < 1e300:
                    k = min(k, max(1, int(math.ceil((arrival[p_starve] + starve - t) / dt))))
                # memory: the largest k whose new blocks fit
                if block == 1:
                    k = min(k, free // n_run)
                else:
                    lo, hi_k = 0, k
                    while lo < hi_k:
                        mid = (lo + hi_k + 1) >> 1
                        need = 0
                        for q in range(n_run):
                            r = run[q]
                            need += (kv[r] + mid + block - 1) // block - blocks[r]
                        if need <= free:
                            lo = mid
                        else:
                            hi_k = mid - 1
                    k = lo
                if k >= 1:
                    area += k * kv_total + n_run * k * (k + 1) // 2
                    for q in range(n_run):
                        r = run[q]
                        if gen[r] == 0:
                            first_tok[r] = t + dt
                        gen[r] += k
                        kv[r] += k
                        nb = (kv[r] + block - 1) // block
                        free -= nb - blocks[r]
                        blocks[r] = nb
                        kv_total += k
                    # the peak is at the last step, before the completions free memory
                    if M_blocks - free > max_used:
                        max_used = M_blocks - free
                    q = 0
                    while q < n_run:
                        r = run[q]
                        if gen[r] == o[r]:
                            finish[r] = t + k * dt
                            state[r] = 3
                            done += 1
                            free += blocks[r]
                            kv_total -= kv[r]
                            kv[r] = 0
                            blocks[r] = 0
                            for p in range(q, n_run - 1):
                                run[p] = run[p + 1]
                            n_run -= 1
                        else:
                            q += 1
                    t += k * dt
                    steps += k
                    skipped += k - 1
                    continue

        # ---- one ordinary step: schedule running requests first
        left = budget
        tokens = 0
        preempted = False
        q = 0
        while q < n_run:
            r = run[q]
            if left <= 0:
                break
            if pre_done[r] < pre_target[r]:
                tok = min(chunk, pre_target[r] - pre_done[r], left)
            else:
                tok = 1
            need = (kv[r] + tok + block - 1) // block - blocks[r]
            self_preempted = False
            while need > free:
                # victim: the lowest-priority running request (highest key, latest arrival)
                vq = 0
                for p in range(1, n_run):
                    a, b = run[p], run[vq]
                    if key_cur[a] > key_cur[b] or (key_cur[a] == key_cur[b] and a > b):
                        vq = p
                v = run[vq]
                free += blocks[v]
                kv_total -= kv[v]
                kv[v] = 0
                blocks[v] = 0
                if sched[v] > 0:  # already scheduled this step: give its tokens back
                    left += sched[v]
                    tokens -= sched[v]
                    sched[v] = 0
                for p in range(vq, n_run - 1):
                    run[p] = run[p + 1]
                n_run -= 1
                if vq < q:
                    q -= 1
                state[v] = 1
                n_wait += 1
                n_preempt[v] += 1
                total_preempt += 1
                pre_target[v] = s[v] + gen[v]
                pre_done[v] = 0
                ver[v] += 1
                if hsize == cap:
                    hsize = _heap_compact(hk, hi, hv, hsize, state, ver)
                hk[hsize], hi[hsize], hv[hsize] = key_cur[v], v, ver[v]
                hsize += 1
                _sift_up(hk, hi, hv, hsize - 1)
                preempted = True
                if v == r:
                    self_preempted = True
                    break
            if self_preempted:
                continue  # run[q] is now the next request
            free -= need
            blocks[r] += need
            kv[r] += tok
            kv_total += tok
            sched[r] = tok
            left -= tok
            tokens += tok
            q += 1

        # ---- then admit waiting requests in policy order (not after a preemption, as vLLM)
        if not preempted:
            while n_run < max_seqs and left > 0:
                while hsize > 0 and (state[hi[0]] != 1 or hv[0] != ver[hi[0]]):
                    hsize = _heap_pop(hk, hi, hv, hsize)
                if hsize == 0:
                    break
                w = hi[0]
                tok = min(chunk, pre_target[w] - pre_done[w], left)
                need = (tok + block - 1) // block
                if need > free:
                    break
                hsize = _heap_pop(hk, hi, hv, hsize)
                state[w] = 2
                n_wait -= 1
                if np.isnan(admitted[w]):
                    admitted[w] = t
                run[n_run] = w
                n_run += 1
                free -= need
                blocks[w] = need
                kv[w] = tok
                kv_total += tok
                sched[w] = tok
                left -= tok
                tokens += tok

        used = M_blocks - free
        if used > max_used:
            max_used = used
        if tokens == 0:
            # nothing could run: only possible when waiting for arrivals
            if next_arr < n:
                t = max(t, arrival[next_arr])
                continue
            break  # stuck (a request larger than memory); caller validated against this

        area += kv_total
        dt = c0 + c1 * tokens
        t_end = t + dt
        q = 0
        while q < n_run:
            r = run[q]
            tok = sched[r]
            if tok == 0:
                q += 1
                continue
            sched[r] = 0
            if pre_done[r] < pre_target[r]:
                pre_done[r] += tok
                q += 1
                continue
            gen[r] += 1
            if gen[r] == 1:
                first_tok[r] = t_end
            if gen[r] == o[r]:
                finish[r] = t_end
                state[r] = 3
                done += 1
                free += blocks[r]
                kv_total -= kv[r]
                kv[r] = 0
                blocks[r] = 0
                for p in range(q, n_run - 1):
                    run[p] = run[p + 1]
                n_run -= 1
            else:
                q += 1
        t = t_end
        steps += 1

    return (first_tok, finish, admitted, n_preempt, steps, skipped, area, max_used,
            rec_t[:n_rec].copy(), rec_wait[:n_rec].copy(), rec_run[:n_rec].copy(),
            rec_kv[:n_rec].copy())


# ---------------------------------------------------------------- Python interface


@dataclass(frozen=True)
class EngineConfig:
    """The serving engine the simulator stands for."""

    M: int = 131_000  # KV cache capacity, tokens
    chunk: int = 512  # prefill chunk s_hat
    token_budget: int = 8192  # max_num_batched_tokens per step
    max_num_seqs: int = 256
    block_size: int = 1  # 1 = token-granular memory; 16 = paged attention blocks
    step_c0: float = 0.04  # seconds per step, constant part (b_bar when step_c1 = 0)
    step_c1: float = 0.0  # seconds per token in the step
    starvation_s: float = 120.0  # math.inf disables the starvation rule

    @property
    def M_blocks(self) -> int:
        return self.M // self.block_size

    def step_time(self, tokens) -> Any:
        return self.step_c0 + self.step_c1 * np.asarray(tokens)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EngineConfig":
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise KeyError(f"unknown engine setting(s) {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)
        if d.get("starvation_s") is None:
            d["starvation_s"] = math.inf
        return cls(**d)


@dataclass
class SimResult:
    arrival: np.ndarray
    s: np.ndarray
    o: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    admitted: np.ndarray
    preemptions: np.ndarray
    steps: int
    skipped_steps: int
    max_used_blocks: int
    area: int = 0  # token-steps of KV held, summed over steps
    series: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def e2e(self) -> np.ndarray:
        return self.finish - self.arrival

    @property
    def per_token(self) -> np.ndarray:
        return self.e2e / self.o

    @property
    def ttft(self) -> np.ndarray:
        return self.first_token - self.arrival

    def steady_throughput(self, lo: float = 0.2) -> float:
        """Completions per second while arrivals are still coming (from `lo` of the arrival
        span to the last arrival): under overload this is the saturation throughput."""
        a0, a1 = float(self.arrival.min()), float(self.arrival.max())
        if a1 <= a0:  # a burst: use the middle of the completions instead
            f = np.sort(self.finish)
            i0, i1 = int(0.2 * f.size), int(0.8 * f.size)
            return (i1 - i0) / (f[i1] - f[i0]) if f[i1] > f[i0] else float("nan")
        t0 = a0 + lo * (a1 - a0)
        done = np.count_nonzero((self.finish >= t0) & (self.finish <= a1))
        return done / (a1 - t0)

    def summary(self) -> dict[str, float]:
        pt, ttft, e2e = self.per_token, self.ttft, self.e2e
        span = float(self.finish.max() - self.arrival.min())
        return {
            "requests": int(self.o.size),
            "mean_per_token_latency": float(pt.mean()),
            "p50_per_token_latency": float(np.percentile(pt, 50)),
            "p90_per_token_latency": float(np.percentile(pt, 90)),
            "p99_per_token_latency": float(np.percentile(pt, 99)),
            "mean_ttft": float(ttft.mean()),
            "p90_ttft": float(np.percentile(ttft, 90)),
            "mean_e2e_latency": float(e2e.mean()),
            "p90_e2e_latency": float(np.percentile(e2e, 90)),
            "throughput_rps": float(self.o.size / span) if span > 0 else float("nan"),
            "throughput_tokens_per_s": float(self.o.sum() / span) if span > 0 else float("nan"),
            "makespan_s": span,
            "preemptions": int(self.preemptions.sum()),
            "max_queue": int(self.series["waiting"].max()) if self.series["waiting"].size else 0,
            "steps": int(self.steps),
        }


def simulate(arrival, s, o, key=None, config: EngineConfig = EngineConfig(), record: int = 4096,
             skip: bool = True) -> SimResult:
    """Serve requests (arrival times in s, prompt and answer lengths in tokens, policy keys:
    lower first; default FCFS) on `config`; returns per-request times and time series.
    `skip=False` ticks every step (same results, slower: for checking the jumps)."""
    arrival = np.asarray(arrival, dtype=np.float64)
    s = np.asarray(s, dtype=np.int64)
    o = np.asarray(o, dtype=np.int64)
    n = arrival.size
    if not (s.size == o.size == n):
        raise ValueError("arrival, s and o must have the same length")
    if n == 0:
        raise ValueError("no requests to simulate")
    if (s < 1).any() or (o < 1).any():
        raise ValueError("prompt and answer lengths must be >= 1 token")
    key = arrival.copy() if key is None else np.asarray(key, dtype=np.float64)
    if key.size != n or not np.isfinite(key).all():
        raise ValueError("policy keys must be finite, one per request")
    c = config
    if c.max_num_seqs < 1 or c.chunk < 1 or c.token_budget < 1 or c.block_size < 1:
        raise ValueError("max_num_seqs, chunk, token_budget and block_size must be >= 1")
    if c.token_budget < c.max_num_seqs:
        # every running request decodes every step; vLLM requires the same
        raise ValueError("token_budget must be >= max_num_seqs")
    if c.step_c0 < 0 or c.step_c1 < 0 or c.step_c0 + c.step_c1 <= 0:
        raise ValueError("step time must be positive")
    biggest = int(((s + o + c.block_size - 1) // c.block_size).max())
    if biggest > c.M_blocks:
        raise ValueError(f"a request of {int((s + o).max())} tokens does not fit in M = {c.M} tokens")
    # the kernel wants arrival order (index order breaks ties FCFS)
    order = np.argsort(arrival, kind="stable")
    inv = np.empty_like(order)
    inv[order] = np.arange(n)
    out = _simulate(arrival[order], s[order], o[order], key[order], int(c.M_blocks), int(c.block_size),
                    int(c.chunk), int(c.token_budget), int(c.max_num_seqs), float(c.step_c0),
                    float(c.step_c1), float(c.starvation_s if math.isfinite(c.starvation_s) else 1e308),
                    int(record), bool(skip))
    first_tok, finish, admitted, n_pre, steps, skipped, area, max_used, rt, rw, rr, rk = out
    if np.isnan(finish).any():
        raise RuntimeError("simulation ended with unfinished requests")
    return SimResult(
        arrival=arrival, s=s, o=o,
        first_token=first_tok[inv], finish=finish[inv], admitted=admitted[inv], preemptions=n_pre[inv],
        steps=int(steps), skipped_steps=int(skipped), max_used_blocks=int(max_used), area=int(area),
        series={"t": rt, "waiting": rw, "running": rr, "kv_tokens": rk},
    )


# ---------------------------------------------------------------- arrivals


def burst(n: int) -> np.ndarray:
    """n requests all at t = 0."""
    return np.zeros(n)


def poisson(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """n Poisson arrivals at `rate` per second, starting at t = 0."""
    if rate <= 0:
        raise ValueError("Poisson rate must be positive")
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    return t - t[0]


def trace(times) -> np.ndarray:
    """Arrival times from a trace (seconds, any order; shifted to start at 0)."""
    t = np.sort(np.asarray(times, dtype=np.float64))
    if t.size == 0 or not np.isfinite(t).all():
        raise ValueError("a trace needs finite arrival times")
    return t - t[0]
