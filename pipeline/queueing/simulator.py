"""A KV-memory-bound serving simulator: the queueing model of document 003 run step by step,
with what vLLM's (V1) scheduler does.

Per step (one forward pass of the engine):
  1. running requests, in admission order (the PARS scheduler's: in key order, `sort_running`), are
     scheduled first: a decoding request takes one
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
emitted by the first decode step (the document's model: o decode steps for o tokens); with
`first_token_at_prefill` it is sampled by the step that completes the prefill, as vLLM does
(o - 1 decode steps; the last token sampled has no KV until the next step).

Speed: the loop is compiled with numba when it is importable (plain Python otherwise, far
slower: fine for tests and small runs). Stretches of pure decoding in which nothing can change the
batch (no arrival, no completion, no admission possible, no preemption) are skipped in one jump,
and an empty system jumps to the next arrival, so the cost is per event, not per step.

Layout: `simulate` checks the inputs and builds the kernel's tables; `_simulate` is the loop, one
helper per part of a step (arrivals and promotions, sampling, the decode jump, scheduling the
running requests with preemption, admission, the end of a step, completions).

Queue order is a per-request key (lower = served first; ties by arrival). The starvation rule
follows the PARS scheduler (pipeline/serving/pars_queue.py): a WAITING request that has waited
`starvation_s` seconds since arrival (running time included) is promoted ahead of every
unpromoted one (promoted ones in arrival order); a running request keeps its key, so the
preemption victim stays the running request with the highest key (ties: the most recently
admitted, vLLM's running[-1]). A request preempted when overdue re-enters promoted, and a
promoted request once running is the last victim.
"""

from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.queueing.latency import latency_summary
from pipeline.queueing.theory import engine_shape_problem, fits_in_cache

try:  # numba ships with vLLM; without it the same code runs as plain Python (slowly)
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_NUMBA = False

    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda f: f


# request states
NOT_ARRIVED, WAITING, RUNNING, DONE = 0, 1, 2, 3
PROMOTED_BASE = -1e300  # a promoted request's key: ahead of all others (queue ties by arrival), last victim

# The kernel works on record arrays (one row per request, heap entry or sample). One array per
# table keeps the helpers' signatures short and fast: numba reference-counts the arrays a compiled
# function is given (a tuple of one array per field made the loop 2.5x slower), and the fields
# of a request that the step loop reads sit together (the first 64 bytes of its record).
REQUEST = np.dtype(
    [
        # read and written every step
        ("prefilled", np.int64),  # prefill tokens computed, of prefill_len
        ("prefill_len", np.int64),  # the prompt, plus the tokens generated before a preemption
        ("kv", np.int64),  # KV tokens held
        ("blocks", np.int64),  # KV blocks held
        ("scheduled", np.int64),  # tokens scheduled in the current step
        ("generated", np.int64),  # answer tokens generated
        ("answer", np.int64),  # input: answer length, tokens
        ("key", np.float64),  # queue key now: the policy key, PROMOTED_BASE once starving while waiting
        # the rest
        ("arrival", np.float64),  # input: seconds
        ("prompt", np.int64),  # input: prompt length, tokens
        ("state", np.int64),  # NOT_ARRIVED, WAITING, RUNNING or DONE
        ("version", np.int64),  # bumped at every re-queue: the request's older heap entries are stale
        ("preemptions", np.int64),
        ("first_token", np.float64),  # times; NaN until they happen (admitted: the first admission)
        ("finish", np.float64),
        ("admitted", np.float64),
        ("ready", np.float64),  # input: when the policy key is known (late scores); <= arrival: at once
        ("final_key", np.float64),  # input: the policy key
    ],
    align=True,
)
# the waiting queue: a binary min-heap of (key, request, version) entries
HEAP_ENTRY = np.dtype([("key", np.float64), ("req", np.int64), ("version", np.int64)], align=True)
# time series, one sample per loop iteration, decimated to fit its buffer
SAMPLE = np.dtype(
    [("t", np.float64), ("waiting", np.int64), ("running", np.int64), ("kv_tokens", np.int64)], align=True
)

# The engine, as numba takes it: a named tuple of scalars (`_engine_args` builds it).
_Engine = namedtuple(
    "_Engine",
    [
        "m_blocks",  # KV cache, blocks
        "block_size",  # tokens per block
        "chunk",  # prefill chunk, tokens
        "budget",  # tokens per step (max_num_batched_tokens)
        "max_seqs",  # running requests at most (max_num_seqs)
        "c0",
        "c1",  # step time = c0 + c1 * tokens in the step, seconds
        "starvation_s",  # promote after waiting this long since arrival (1e308: never)
        "first_at_prefill",  # 1: the step completing a prefill samples a token (vLLM); 0: the document
    ],
)


# ---------------------------------------------------------------- the waiting queue
# A binary min-heap of HEAP_ENTRY records, ordered by key, then request index (= arrival order:
# the FCFS tie-break). Re-queueing a request bumps its version instead of deleting its old entry,
# which goes stale and is dropped when it surfaces (lazy deletion). The caller keeps the size.


@njit(cache=True)
def _less(heap, a, b):
    return heap[a].key < heap[b].key or (heap[a].key == heap[b].key and heap[a].req < heap[b].req)


@njit(cache=True)
def _set(heap, p, key, r, version):
    e = heap[p]
    e.key = key
    e.req = r
    e.version = version


@njit(cache=True)
def _swap(heap, a, b):
    key, r, version = heap[a].key, heap[a].req, heap[a].version
    _set(heap, a, heap[b].key, heap[b].req, heap[b].version)
    _set(heap, b, key, r, version)


@njit(cache=True)
def _sift_up(heap, pos):
    while pos > 0:
        parent = (pos - 1) >> 1
        if _less(heap, pos, parent):
            _swap(heap, pos, parent)
            pos = parent
        else:
            break


@njit(cache=True)
def _sift_down(heap, pos, size):
    while True:
        left = 2 * pos + 1
        if left >= size:
            break
        best = left
        if left + 1 < size and _less(heap, left + 1, left):
            best = left + 1
        if _less(heap, best, pos):
            _swap(heap, best, pos)
            pos = best
        else:
            break


@njit(cache=True)
def _heap_pop(heap, size):
    size -= 1
    if size > 0:
        _set(heap, 0, heap[size].key, heap[size].req, heap[size].version)
        _sift_down(heap, 0, size)
    return size


@njit(cache=True)
def _is_stale(heap, p, req):
    e = heap[p]
    return req[e.req].state != WAITING or e.version != req[e.req].version


@njit(cache=True)
def _heap_compact(heap, size, req):
    """Drop stale entries and re-heapify; returns the new size."""
    j = 0
    for p in range(size):
        if not _is_stale(heap, p, req):
            _set(heap, j, heap[p].key, heap[p].req, heap[p].version)
            j += 1
    for p in range((j >> 1) - 1, -1, -1):
        _sift_down(heap, p, j)
    return j


@njit(cache=True)
def _heap_push(heap, size, req, r):
    """Queue request r with its current key and version (compacting a full heap first); returns
    the new size."""
    if size == heap.shape[0]:
        size = _heap_compact(heap, size, req)
    _set(heap, size, req[r].key, r, req[r].version)
    _sift_up(heap, size)
    return size + 1


@njit(cache=True)
def _heap_drop_stale(heap, size, req):
    """Pop stale entries off the top, so that heap[0] is the real head of the queue."""
    while size > 0 and _is_stale(heap, 0, req):
        size = _heap_pop(heap, size)
    return size


# ---------------------------------------------------------------- the parts of a step
# Loop state kept in scalars (returned by the helpers that change it):
#   running[:n_run]  running requests in admission (or, sort_running, key) order;  free  KV blocks free;
#   kv_total         KV tokens held by all;  heap_size  entries in the waiting-queue heap.
# Waiting requests are counted, not kept: next_arrival - n_run - n_done.


@njit(cache=True)
def _arrive_and_promote(req, t, starvation_s, next_arrival, next_promotion, heap, heap_size, provisional):
    """Queue the requests that arrived by time t (one whose key is not known yet waits with the
    `provisional` key), then promote the waiting ones that have waited `starvation_s` (in arrival
    order, so `next_promotion` is the oldest not yet looked at). A running request keeps its key (it
    stays a preemption victim by key, as in the scheduler); if preempted later it re-enters promoted
    (`_preempt_lowest`). Returns (next_arrival, next_promotion, heap_size)."""
    n = req.shape[0]
    while next_arrival < n and req[next_arrival].arrival <= t:
        rq = req[next_arrival]
        rq.state = WAITING
        rq.key = rq.final_key if rq.ready <= t else provisional
        heap_size = _heap_push(heap, heap_size, req, next_arrival)
        next_arrival += 1
    while next_promotion < next_arrival and req[next_promotion].arrival + starvation_s <= t:
        rq = req[next_promotion]
        if rq.state == WAITING:  # re-queue with the promoted key; the old entry goes stale
            rq.key = PROMOTED_BASE
            rq.version += 1
            heap_size = _heap_push(heap, heap_size, req, next_promotion)
        next_promotion += 1
    return next_arrival, next_promotion, _heap_drop_stale(heap, heap_size, req)


@njit(cache=True)
def _deliver_scores(req, t, by_ready, next_ready, heap, heap_size, score_sum):
    """Late scores known by time t (in `by_ready` order): each joins the running mean that places
    the next unscored arrivals, and a waiting request moves to its real place (a promoted one keeps
    its place at the front). Returns (next_ready, heap_size, score_sum)."""
    n = req.shape[0]
    while next_ready < n and req[by_ready[next_ready]].ready <= t:
        r = by_ready[next_ready]
        rq = req[r]
        score_sum += rq.final_key
        if rq.key != PROMOTED_BASE and rq.key != rq.final_key:
            rq.key = rq.final_key
            if rq.state == WAITING:
                rq.version += 1
                heap_size = _heap_push(heap, heap_size, req, r)
        next_ready += 1
    return next_ready, _heap_drop_stale(heap, heap_size, req), score_sum


@njit(cache=True)
def _record(series, n_rec, stride, tick, t, waiting, n_run, kv_total):
    """Sample the state every `stride`-th tick; a full buffer keeps every other sample and
    doubles the stride. Returns (n_rec, stride)."""
    if tick % stride == 0:
        cap = series.shape[0]
        if n_rec == cap:
            for p in range(cap // 2):
                a, b = series[p], series[2 * p]
                a.t, a.waiting, a.running, a.kv_tokens = b.t, b.waiting, b.running, b.kv_tokens
            n_rec = cap // 2
            stride *= 2
        if tick % stride == 0:
            a = series[n_rec]
            a.t, a.waiting, a.running, a.kv_tokens = t, waiting, n_run, kv_total
            n_rec += 1
    return n_rec, stride


@njit(cache=True)
def _free_kv(rq, free, kv_total):
    """Release request record rq's KV; returns (free, kv_total)."""
    free += rq.blocks
    kv_total -= rq.kv
    rq.kv = 0
    rq.blocks = 0
    return free, kv_total


@njit(cache=True)
def _retire_finished(req, running, n_run, t_done, free, kv_total):
    """Complete the running requests that have generated their whole answer (at time t_done):
    free their KV and drop them from the running list (order kept).
    Returns (n_run, free, kv_total, completed)."""
    kept = 0
    for q in range(n_run):
        r = running[q]
        rq = req[r]
        if rq.generated == rq.answer:
            rq.finish = t_done
            rq.state = DONE
            free, kv_total = _free_kv(rq, free, kv_total)
        else:
            running[kept] = r
            kept += 1
    return kept, free, kv_total, n_run - kept


@njit(cache=True)
def _stretch_length(req, eng, running, n_run, heap, heap_size, free, t, dt, next_arrival, next_promotion, next_ready_t):
    """How many steps of pure decoding (each `dt` long) nothing can interrupt from now: no arrival,
    promotion or completion before the last, no admission possible, memory for all of them.
    0: simulate the next step normally."""
    if n_run == 0 or n_run > eng.budget:
        return 0
    for q in range(n_run):
        rq = req[running[q]]
        if rq.prefilled < rq.prefill_len:
            return 0
    block = eng.block_size
    if heap_size > 0 and n_run < eng.max_seqs and eng.budget - n_run > 0:
        head = req[heap[0].req]  # could the head of the queue be admitted? then no jump
        tok = min(eng.chunk, head.prefill_len - head.prefilled, eng.budget - n_run)
        if (tok + block - 1) // block <= free:
            return 0
    k = 1 << 62
    for q in range(n_run):
        rq = req[running[q]]
        k = min(k, rq.answer - rq.generated)
    if next_arrival < req.shape[0]:
        k = min(k, max(1, int(math.ceil((req[next_arrival].arrival - t) / dt))))
    if next_ready_t < 1e300:  # a late score may change the head of the queue
        k = min(k, max(1, int(math.ceil((next_ready_t - t) / dt))))
    if next_promotion < next_arrival and eng.starvation_s < 1e300:
        k = min(k, max(1, int(math.ceil((req[next_promotion].arrival + eng.starvation_s - t) / dt))))
    # memory: the largest k whose new blocks fit
    if block == 1:
        return min(k, free // n_run)
    lo, hi = 0, k
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        need = 0
        for q in range(n_run):
            rq = req[running[q]]
            need += (rq.kv + mid + block - 1) // block - rq.blocks
        if need <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit(cache=True)
def _decode_stretch(req, block, running, n_run, free, kv_total, t, dt, k):
    """Every running request decodes k tokens (steps t .. t + k*dt); returns (free, kv_total)."""
    for q in range(n_run):
        rq = req[running[q]]
        if rq.generated == 0:
            rq.first_token = t + dt
        rq.generated += k
        rq.kv += k
        nb = (rq.kv + block - 1) // block
        free -= nb - rq.blocks
        rq.blocks = nb
        kv_total += k
    return free, kv_total


@njit(cache=True)
def _preempt_lowest(req, running, n_run, free, kv_total, heap, heap_size, t, starvation_s):
    """Preempt the lowest-priority running request (highest key; ties: the most recently admitted,
    as vLLM preempts running[-1]), by recompute: its KV is freed, tokens it had scheduled this step
    are dropped, and it goes back to the queue to re-prefill prompt + generated tokens, promoted
    if it has waited `starvation_s` since arrival by time t.
    Returns (victim, its position in running, n_run, free, kv_total, heap_size, tokens dropped)."""
    pos = 0
    for p in range(1, n_run):  # ties in `running` are in admission order: >= moves them to the latest
        if req[running[p]].key >= req[running[pos]].key:
            pos = p
    v = running[pos]
    for p in range(pos, n_run - 1):
        running[p] = running[p + 1]
    rq = req[v]
    free, kv_total = _free_kv(rq, free, kv_total)
    dropped = rq.scheduled
    rq.scheduled = 0
    rq.state = WAITING
    rq.preemptions += 1
    rq.prefill_len = rq.prompt + rq.generated
    rq.prefilled = 0
    if rq.arrival + starvation_s <= t:  # same test as _arrive_and_promote, which skipped it running
        rq.key = PROMOTED_BASE
    rq.version += 1
    heap_size = _heap_push(heap, heap_size, req, v)
    return v, pos, n_run - 1, free, kv_total, heap_size, dropped


@njit(cache=True)
def _sort_running(req, running, n_run):
    """Order `running` by ascending key, ties in admission order, as the PARS scheduler keeps it
    (so shorter-predicted requests get the step's token budget first). Insertion sort: stable, and
    near-linear since only the latest admissions and re-keyed requests are out of place."""
    for i in range(1, n_run):
        r = running[i]
        k = req[r].key
        j = i - 1
        while j >= 0 and req[running[j]].key > k:
            running[j + 1] = running[j]
            j -= 1
        running[j + 1] = r


@njit(cache=True)
def _schedule_running(req, eng, t, running, n_run, free, kv_total, heap, heap_size):
    """Schedule the running requests in `running`'s order at time t: a decoding request takes one
    token, a prefilling one a chunk (at most what is left of the budget), preempting while their KV
    does not fit. Returns (tokens, preempted, n_run, free, kv_total, heap_size)."""
    block = eng.block_size
    tokens = 0
    preempted = False
    q = 0
    while q < n_run:
        r = running[q]
        rq = req[r]
        left = eng.budget - tokens
        if left <= 0:
            break
        if rq.prefilled < rq.prefill_len:
            tok = min(eng.chunk, rq.prefill_len - rq.prefilled, left)
        else:
            tok = 1
        need = (rq.kv + tok + block - 1) // block - rq.blocks
        self_preempted = False
        while need > free:
            v, pos, n_run, free, kv_total, heap_size, dropped = _preempt_lowest(
                req, running, n_run, free, kv_total, heap, heap_size, t, eng.starvation_s
            )
            tokens -= dropped
            preempted = True
            if pos < q:
                q -= 1
            if v == r:
                self_preempted = True
                break
        if self_preempted:
            continue  # running[q] is now the next request
        free -= need
        rq.blocks += need
        rq.kv += tok
        rq.scheduled = tok
        kv_total += tok
        tokens += tok
        q += 1
    return tokens, preempted, n_run, free, kv_total, heap_size


@njit(cache=True)
def _admit_waiting(req, eng, t, running, n_run, free, kv_total, heap, heap_size, tokens):
    """Admit waiting requests in queue order while the budget, max_seqs and memory for their
    first chunk allow; the first that does not fit stops admission (vLLM does not skip over the
    head). Returns (tokens, n_run, free, kv_total, heap_size)."""
    block = eng.block_size
    while n_run < eng.max_seqs and tokens < eng.budget:
        heap_size = _heap_drop_stale(heap, heap_size, req)
        if heap_size == 0:
            break
        w = heap[0].req
        rq = req[w]
        tok = min(eng.chunk, rq.prefill_len - rq.prefilled, eng.budget - tokens)
        need = (tok + block - 1) // block
        if need > free:
            break
        heap_size = _heap_pop(heap, heap_size)
        rq.state = RUNNING
        if np.isnan(rq.admitted):
            rq.admitted = t
        running[n_run] = w
        n_run += 1
        free -= need
        rq.blocks = need  # a waiting request holds no KV
        rq.kv = tok
        rq.scheduled = tok
        kv_total += tok
        tokens += tok
    return tokens, n_run, free, kv_total, heap_size


@njit(cache=True)
def _advance_scheduled(req, running, n_run, t_end, first_at_prefill):
    """The step ran: scheduled prefill tokens are computed, decoding requests emit a token (the
    first at t_end is the first token), and so does a request whose prefill this step completed
    when `first_at_prefill`. Returns how many have now generated their whole answer."""
    finished = 0
    for q in range(n_run):
        rq = req[running[q]]
        tok = rq.scheduled
        if tok == 0:
            continue
        rq.scheduled = 0
        if rq.prefilled < rq.prefill_len:
            rq.prefilled += tok
            if not first_at_prefill or rq.prefilled < rq.prefill_len:
                continue
        rq.generated += 1
        if rq.generated == 1:
            rq.first_token = t_end
        if rq.generated == rq.answer:
            finished += 1
    return finished


# ---------------------------------------------------------------- the step loop


@njit(cache=True)
def _simulate(req, heap, eng, series, skip, by_ready, first_provisional, sort_running):
    """Serve the requests in `req` (REQUEST records in arrival order, not yet arrived) on engine
    `eng` (an _Engine) until all are done, filling their result fields and `series` (SAMPLE
    records); `heap` (HEAP_ENTRY records) is the waiting queue's room; `skip` jumps over
    uninterruptible stretches of decoding; `by_ready` orders the requests by the time their key
    is known; until the first is, an unscored request waits with `first_provisional`;
    `sort_running` serves running requests by key (the PARS scheduler), else in admission order.
    Returns (steps, skipped steps, area = KV token-steps, peak used blocks, samples recorded)."""
    n = req.shape[0]
    heap_size = 0
    running = np.empty(min(eng.max_seqs, n), np.int64)  # never more than n run: a huge max_seqs allocates nothing
    n_run = 0
    free = eng.m_blocks
    kv_total = 0
    peak = 0
    next_arrival = 0
    next_promotion = 0
    n_done = 0
    t = 0.0
    steps = 0
    skipped = 0
    area = 0  # sum over steps of KV tokens held: the simulated counterpart of sum g(s, o)
    n_rec = 0
    stride = 1
    tick = 0
    next_ready = 0  # late scores delivered so far (by_ready order) and the sum of their keys
    score_sum = 0.0

    while n_done < n:
        next_ready, heap_size, score_sum = _deliver_scores(req, t, by_ready, next_ready, heap, heap_size, score_sum)
        provisional = score_sum / next_ready if next_ready else first_provisional
        next_arrival, next_promotion, heap_size = _arrive_and_promote(
            req, t, eng.starvation_s, next_arrival, next_promotion, heap, heap_size, provisional
        )
        n_rec, stride = _record(series, n_rec, stride, tick, t, next_arrival - n_run - n_done, n_run, kv_total)
        tick += 1

        if n_run == 0 and heap_size == 0:  # empty system: jump to the next arrival
            if next_arrival < n:
                t = max(t, req[next_arrival].arrival)
                continue
            break  # unreachable while n_done < n

        if skip:  # fast path: k steps of pure decoding in one jump
            dt = eng.c0 + eng.c1 * n_run
            next_ready_t = req[by_ready[next_ready]].ready if next_ready < n else 1e308
            k = _stretch_length(
                req, eng, running, n_run, heap, heap_size, free, t, dt, next_arrival, next_promotion, next_ready_t
            )
            if k >= 1:
                area += k * kv_total + n_run * k * (k + 1) // 2
                free, kv_total = _decode_stretch(req, eng.block_size, running, n_run, free, kv_total, t, dt, k)
                # the peak is at the last step, before the completions free memory
                peak = max(peak, eng.m_blocks - free)
                n_run, free, kv_total, completed = _retire_finished(req, running, n_run, t + k * dt, free, kv_total)
                n_done += completed
                t += k * dt
                steps += k
                skipped += k - 1
                continue

        # one ordinary step: running requests first, then (unless one was preempted, as vLLM)
        # waiting ones in policy order
        if sort_running:
            _sort_running(req, running, n_run)
        tokens, preempted, n_run, free, kv_total, heap_size = _schedule_running(
            req, eng, t, running, n_run, free, kv_total, heap, heap_size
        )
        if not preempted:
            tokens, n_run, free, kv_total, heap_size = _admit_waiting(
                req, eng, t, running, n_run, free, kv_total, heap, heap_size, tokens
            )
        peak = max(peak, eng.m_blocks - free)
        if tokens == 0:
            # nothing could run: only possible when waiting for arrivals
            if next_arrival < n:
                t = max(t, req[next_arrival].arrival)
                continue
            break  # stuck (a request larger than memory); caller validated against this

        area += kv_total
        dt = eng.c0 + eng.c1 * tokens
        t_end = t + dt
        if _advance_scheduled(req, running, n_run, t_end, eng.first_at_prefill) > 0:
            n_run, free, kv_total, completed = _retire_finished(req, running, n_run, t_end, free, kv_total)
            n_done += completed
        t = t_end
        steps += 1

    return steps, skipped, area, peak, n_rec


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
    # the step completing a prefill samples the first token (vLLM; o - 1 decode steps for o tokens);
    # False: the first decode step does (the document's model, which the queueing theory follows)
    first_token_at_prefill: bool = False

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
        return {
            **latency_summary(self.arrival, self.first_token, self.finish, self.o),
            "preemptions": int(self.preemptions.sum()),
            "max_queue": int(self.series["waiting"].max()) if self.series["waiting"].size else 0,
            "steps": int(self.steps),
        }


def _engine_args(c: EngineConfig) -> _Engine:
    """The kernel's engine tuple (an infinite starvation_s becomes 1e308)."""
    starve = float(c.starvation_s) if math.isfinite(c.starvation_s) else 1e308
    return _Engine(
        int(c.M_blocks),
        int(c.block_size),
        int(c.chunk),
        int(c.token_budget),
        int(c.max_num_seqs),
        float(c.step_c0),
        float(c.step_c1),
        starve,
        int(bool(c.first_token_at_prefill)),
    )


def _new_requests(arrival: np.ndarray, s: np.ndarray, o: np.ndarray, key: np.ndarray, ready: np.ndarray) -> np.recarray:
    """The kernel's request table, none arrived yet (a recarray, so that the kernel's record
    attributes work in plain Python too)."""
    req = np.zeros(arrival.size, REQUEST).view(np.recarray)
    req.arrival, req.prompt, req.answer, req.key, req.prefill_len = arrival, s, o, key, s
    req.final_key, req.ready = key, ready
    req.state = NOT_ARRIVED
    req.first_token = req.finish = req.admitted = np.nan
    return req


def _token_counts(x, what: str) -> np.ndarray:
    """Lengths as int64, refusing what a cast would silently change (NaN, 2.5 tokens, text)."""
    x = np.asarray(x)
    if x.dtype.kind not in "iuf" or (x.dtype.kind == "f" and not (np.isfinite(x).all() and (x == np.floor(x)).all())):
        raise ValueError(f"{what} lengths must be whole numbers of tokens")
    return x.astype(np.int64)


def simulate(
    arrival,
    s,
    o,
    key=None,
    config: EngineConfig = EngineConfig(),
    record: int = 4096,
    skip: bool = True,
    key_ready=None,
    first_provisional: float = 0.0,
    sort_running: bool = False,
) -> SimResult:
    """Serve requests (arrival times in s, prompt and answer lengths in tokens, policy keys:
    lower first; default FCFS) on `config`; returns per-request times and time series.
    `skip=False` ticks every step (same results, slower: for checking the jumps).

    `key_ready` (seconds, per request; default: at arrival) is when each key becomes known, as
    with the PARS scheduler's background scorer: until then the request waits with the mean of the
    keys known so far (`first_provisional` before any: the scheduler's checkpoint typical score),
    then moves to its place. `sort_running`: each step serves the running requests in key order
    (the PARS scheduler keeps `running` so), not in admission order (vLLM's FCFS scheduler)."""
    arrival = np.asarray(arrival, dtype=np.float64)
    if not np.isfinite(arrival).all():
        raise ValueError("arrival times must be finite")
    s, o = _token_counts(s, "prompt"), _token_counts(o, "answer")
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
    if not math.isfinite(first_provisional):
        raise ValueError("first_provisional must be finite")
    c = config
    sizes = {k: getattr(c, k) for k in ("M", "max_num_seqs", "chunk", "token_budget", "block_size")}
    for k, v in sizes.items():  # whole numbers the kernel's int64 holds (numba overflows on 1e30)
        number = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
        if not (number and math.isfinite(v) and v == int(v) and 1 <= v < 2**62):
            raise ValueError(f"engine setting {k} {v!r}: must be a whole number from 1 to 2**62")
    problem = engine_shape_problem(c.M, c.token_budget, c.max_num_seqs, c.block_size)
    if problem:
        raise ValueError(problem)
    if not isinstance(c.first_token_at_prefill, (bool, np.bool_)):  # bool("false") is True
        raise ValueError(f"first_token_at_prefill {c.first_token_at_prefill!r} must be True or False")
    if c.step_c0 < 0 or c.step_c1 < 0 or c.step_c0 + c.step_c1 <= 0:
        raise ValueError("step time must be positive")
    if not fits_in_cache(int((s + o).max()), c.M, c.block_size):
        raise ValueError(f"a request of {int((s + o).max())} tokens does not fit in M = {c.M} tokens")
    if record < 1:
        raise ValueError("record must be >= 1 sample")
    ready = arrival.copy() if key_ready is None else np.asarray(key_ready, dtype=np.float64)
    if ready.shape != arrival.shape or np.isnan(ready).any():
        raise ValueError("key_ready must be one time per request")
    ready = np.maximum(ready, arrival)
    # the kernel wants arrival order (index order breaks ties FCFS)
    order = np.argsort(arrival, kind="stable")
    inv = np.empty_like(order)
    inv[order] = np.arange(n)
    req = _new_requests(arrival[order], s[order], o[order], key[order], ready[order])
    by_ready = np.argsort(req.ready, kind="stable").astype(np.int64)
    heap = np.zeros(2 * n + 1024, HEAP_ENTRY).view(np.recarray)  # compacted when full
    series = np.zeros(int(record), SAMPLE).view(np.recarray)
    steps, skipped, area, peak, n_rec = _simulate(
        req, heap, _engine_args(c), series, bool(skip), by_ready, float(first_provisional), bool(sort_running)
    )
    if np.isnan(req.finish).any():
        raise RuntimeError("simulation ended with unfinished requests")
    return SimResult(
        arrival=arrival,
        s=s,
        o=o,
        first_token=req.first_token[inv],
        finish=req.finish[inv],
        admitted=req.admitted[inv],
        preemptions=req.preemptions[inv],
        steps=int(steps),
        skipped_steps=int(skipped),
        max_used_blocks=int(peak),
        area=int(area),
        series={name: series[name][:n_rec].copy() for name in SAMPLE.names},
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
