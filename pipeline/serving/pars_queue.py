"""The PARS waiting queue: ascending score, with starvation promotion.

A drop-in for vLLM's `RequestQueue` (the FCFS deque or the priority heap). Entries live in two heaps,
by (key, arrival) and by arrival, with lazy deletion; peek/pop are O(log n) amortised and nothing is
re-sorted per step. A request's key is `(priority, score)`; the scheduler sets it (`request.pars_key`)
through the `score_fn` given here, and may change it later with `rekey()` (a background score that
arrived after the request was queued with a provisional key).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

# A starved request, once running, sorts first in `running` (the last preemption victim).
FIRST_SCORE = -math.inf


def _timed(method):
    """Adds the time spent in a method vLLM calls to the queue's `busy_s`: that work runs inside
    vLLM's schedule() and add/abort paths, and is PARS code all the same. (No timed method calls
    another, so nothing is counted twice.)"""

    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.busy_s += time.perf_counter() - start

    return timed


class _Entry:
    """One queued request; shared by both heaps so removal is O(1) (lazy deletion). A dead entry
    drops its request: it may sit in a heap long after (until it reaches a top, or compaction), and
    must not keep the request's token lists and block hashes alive that long."""

    __slots__ = ("key", "arrival", "since", "first", "seq", "request", "alive")

    def __init__(self, key, arrival: float, since: float, first: int, seq: int, request: Request):
        self.key, self.arrival, self.since, self.first, self.seq = key, arrival, since, first, seq
        self.request, self.alive = request, True


class PARSRequestQueue(RequestQueue):
    """The waiting queue: ascending (priority, score), with starvation promotion within a priority.

    Two heaps over the same entries: by (priority, score, arrival) and by (priority, time queued,
    order first queued).
    Each peek/pop is O(log n) amortised; nothing is re-sorted per step. Requests added before they
    have a key sit in `pending` (in arrival order) until `flush()` hands them to `score_fn` together.

    Starvation: a request that has waited more than `starvation_s` since this queue first saw it
    goes next, oldest first, but only ahead of requests of its own priority level or lower: user
    priority stays strict (a starved priority-5 request does not pass a waiting priority-0 one; with
    vLLM's default FCFS policy every request has priority 0). The wait is timed on this queue's own
    monotonic clock, not from `Request.arrival_time`, which clients and tests may stamp on another
    clock (vLLM's tests use 0..N s after 1970); a preempted request keeps its first time queued."""

    def __init__(
        self,
        score_fn: Callable[[list[Request]], None],
        starvation_s: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._score_fn = score_fn  # sets request.pars_key on every request it is given
        self.starvation_s = starvation_s
        self.clock = clock
        self.now = clock()  # fixed per schedule() so peek and pop always agree
        self._pending: list[Request] = []
        self._by_score: list[tuple] = []
        self._by_age: list[tuple] = []
        self._entries: dict[Request, _Entry] = {}
        self._seq = itertools.count()
        self._first = itertools.count()
        self._dead = 0
        self.busy_s = 0.0  # seconds spent in the methods vLLM calls (`_timed`)

    # -- scoring and the clock --------------------------------------------------------------
    def flush(self) -> None:
        """Give every pending request its key (one `score_fn` call) and push it; refresh the clock."""
        self.now = self.clock()
        if self._pending:
            pending, self._pending = self._pending, []
            try:
                self._score_fn(pending)
            finally:  # whatever score_fn did, every request stays queued (keyed last if it has no key)
                for request in pending:
                    if not hasattr(request, "pars_key"):
                        request.pars_key = (request.priority, math.inf)
                    self._push(request)

    def rekey(self, request: Request) -> bool:
        """Re-place a queued request after its `pars_key` changed; False when it is not queued."""
        entry = self._entries.get(request)
        if entry is None:
            return False
        self._kill(entry)
        self._push(request)
        return True

    def _push(self, request: Request) -> None:
        if request in self._entries:  # already queued: keep one entry (never lose or duplicate)
            return
        if not hasattr(request, "pars_key"):
            self._score_fn([request])
        self._first_seen(request)
        entry = _Entry(
            request.pars_key, request.arrival_time, request.pars_since, request.pars_first, next(self._seq), request
        )
        self._entries[request] = entry
        heapq.heappush(self._by_score, (entry.key, entry.arrival, entry.seq, entry))
        heapq.heappush(self._by_age, (request.priority, entry.since, entry.first, entry.seq, entry))

    def _first_seen(self, request: Request) -> None:
        """Stamp a request the first time this queue sees it: when (the wait is timed from here, class
        doc) and in what order (ties between equal times). Both survive preemption, so a preempted
        request does not fall behind requests that were queued after it in the same clock tick."""
        if not hasattr(request, "pars_since"):
            request.pars_since = self.clock()
            request.pars_first = next(self._first)

    # -- RequestQueue -------------------------------------------------------------------------
    @_timed
    def add_request(self, request: Request) -> None:
        self._first_seen(request)
        if hasattr(request, "pars_key"):
            self._push(request)  # a request seen before (e.g. resumed) keeps its score
        else:
            self._pending.append(request)

    @_timed
    def prepend_request(self, request: Request) -> None:
        # Preempted or skipped requests re-enter by their score, not at the front.
        self._push(request)

    @_timed
    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self._push(request)

    def _select(self) -> tuple[_Entry, bool]:
        """The next request, and whether it was chosen because it starved."""
        if self._pending:  # safety net: schedule() flushes first, so this is normally empty
            self.flush()
        age, score = self._by_age, self._by_score
        while age and not age[0][-1].alive:
            heapq.heappop(age)
        # The age heap's top is the oldest request of the most urgent priority level present: the
        # only one that may be promoted (starvation works within a priority level).
        if age and self.now - age[0][1] > self.starvation_s:
            return age[0][-1], True
        while score and not score[0][3].alive:
            heapq.heappop(score)
        if not score:
            raise IndexError("peek from an empty PARS queue")
        return score[0][3], False

    @_timed
    def peek_request(self) -> Request:
        return self._select()[0].request

    @_timed
    def pop_request(self) -> Request:
        entry, starved = self._select()
        request = entry.request  # before _kill drops it
        self._kill(entry)
        if starved:
            # A starved request keeps its place once running: it sorts first in `running`, so it is
            # the last preemption victim, not the first (its score is likely the highest). Its age
            # alone orders it if it ever waits again.
            request.pars_key = (request.priority, FIRST_SCORE)
            request.pars_starved = True  # a score arriving later must not undo this
        return request

    def _kill(self, entry: _Entry) -> None:
        entry.alive = False
        del self._entries[entry.request]
        entry.request = None  # nothing reads a dead entry's request (_select skips dead entries)
        self._dead += 1
        # Compact when dead entries dominate, so the heaps stay O(live).
        if self._dead > 64 and self._dead > 2 * len(self._entries):
            self._by_score = [e for e in self._by_score if e[3].alive]
            self._by_age = [e for e in self._by_age if e[-1].alive]
            heapq.heapify(self._by_score)
            heapq.heapify(self._by_age)
            self._dead = 0

    def remove_request(self, request: Request) -> None:  # timed in remove_requests
        self.remove_requests((request,))

    @_timed
    def remove_requests(self, requests: Iterable[Request]) -> None:
        gone = set(requests)
        if self._pending:
            self._pending = [r for r in self._pending if r not in gone]
        for request in gone:
            entry = self._entries.get(request)
            if entry is not None:
                self._kill(entry)

    def __bool__(self) -> bool:
        return bool(self._entries) or bool(self._pending)

    def __len__(self) -> int:
        return len(self._entries) + len(self._pending)

    def __iter__(self) -> Iterator[Request]:
        """Service order as of now (a sorted copy; for inspection, not the hot path): per priority
        level, its starved requests oldest first, then the rest by score."""

        def order(e: _Entry):
            if self.now - e.since > self.starvation_s:
                return (e.request.priority, 0, e.since, e.first, e.seq)
            return (e.request.priority, 1, e.key, e.arrival, e.seq)

        yield from (e.request for e in sorted(self._entries.values(), key=order))
        yield from self._pending
