"""Score prompts on a background thread, so the engine's schedule() never waits on the ranker.

The scheduler hands over work with `submit()` (O(1)) and collects finished results with `take()`
(non-blocking). The worker batches whatever has queued up, up to `batch_size`, in arrival order;
items that `first(item)` says yes to go before the others (the scheduler: requests still waiting,
whose score decides when they run, before those admitted on a provisional score).
A scorer may deliver a batch in parts, as each forward pass finishes, so the first scores of a
burst reach the queue in a fraction of a second instead of after the whole batch.
A batch that fails is reported as failed (its error travels with the results); the thread never dies.
Torch and the Rust tokenizer release the GIL for their heavy parts, so the engine keeps stepping.
No vLLM import.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

_STOP = object()

# score_batch(items) -> one float (or None: nothing to score from) per item, in order; or an
# iterator of parts (positions in items, their scores), each delivered as soon as it is yielded
ScoreParts = Iterator[tuple[Sequence[int], Sequence[float | None]]]
ScoreBatch = Callable[[Sequence[Any]], Sequence[float | None] | ScoreParts]


@dataclass
class ScoredBatch:
    items: list[Any]
    scores: list[float | None]  # all None when the batch failed
    error: BaseException | None
    seconds: float


class ScoringWorker:
    def __init__(
        self,
        score_batch: ScoreBatch,
        batch_size: int,
        name: str = "pars-scorer",
        thread_init: Callable[[], None] | None = None,
        first: Callable[[Any], bool] | None = None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._score_batch = score_batch
        self._thread_init = thread_init  # run once on the worker thread before its first batch
        self.init_error: BaseException | None = None  # what thread_init raised, if it did
        self._batch_size = int(batch_size)
        self._first = first  # called on the worker thread, on items it holds
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._held: list[Any] = []  # the worker thread's: taken from the inbox, not yet batched
        self._done: deque[ScoredBatch] = deque()  # append/popleft are atomic: no lock needed
        self._submitted = 0
        self._finished = 0  # items scored or dropped; both threads add to it (under _lock)
        self._lock = threading.Lock()
        self._closed = False
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: Any) -> None:
        if self._closed:
            raise RuntimeError("the scoring worker is closed")
        with self._lock:  # against _count_finished setting idle from a stale count
            self._submitted += 1
            self._idle.clear()
        self._inbox.put(item)

    def take(self) -> list[ScoredBatch]:
        """Every batch finished since the last call (never blocks)."""
        out = []
        while self._done:
            out.append(self._done.popleft())
        return out

    @property
    def backlog(self) -> int:
        """Items submitted and not yet scored."""
        return self._submitted - self._finished

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until everything submitted so far is scored (tests and benchmarks only)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.backlog:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._idle.wait(left if left is not None else 0.05)
            if self.backlog:
                time.sleep(0.001)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread: the backlog is dropped (the engine is going away), the batch in hand is
        finished, then the thread is joined (idempotent)."""
        self._closed = True
        dropped = 0
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            # not scored: wait_idle must not wait for it (a stop marker left by an earlier close whose
            # join timed out is no submitted item)
            dropped += item is not _STOP
        self._count_finished(dropped)
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout)

    def _deliver(
        self, items: list[Any], scores: list[float | None], error: BaseException | None, seconds: float
    ) -> None:
        self._done.append(ScoredBatch(items, scores, error, seconds))
        self._count_finished(len(items))

    def _count_finished(self, count: int) -> None:
        with self._lock:  # close() (the caller's thread) and the worker both add to it
            self._finished += count
            if self._finished == self._submitted:
                self._idle.set()

    def _next_batch(self) -> list[Any] | None:
        """Up to batch_size items (blocks until there is one); None when close() stopped the thread:
        the items still held are dropped, like the inbox's."""
        held, stop = self._held, False
        try:
            while not stop:
                item = self._inbox.get(block=not held)  # waits only while nothing is held
                stop = item is _STOP
                if not stop:
                    held.append(item)
        except queue.Empty:
            pass
        if stop:
            self._held = []
            self._count_finished(len(held))
            return None
        if self._first is not None:
            try:
                firsts = [bool(self._first(x)) for x in held]
            except Exception:  # a broken `first` costs the order, not the thread: arrival order
                firsts = [True] * len(held)
            # stable: arrival order within each group
            held = [x for x, f in zip(held, firsts) if f] + [x for x, f in zip(held, firsts) if not f]
        batch, self._held = held[: self._batch_size], held[self._batch_size :]
        return batch

    def _run(self) -> None:
        if self._thread_init is not None:
            try:
                self._thread_init()
            except Exception as exc:  # a thread setting that cannot be applied must not stop scoring
                self.init_error = exc
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            start = time.perf_counter()
            delivered: set[int] = set()
            try:
                result = self._score_batch(batch)
                parts = result if isinstance(result, Iterator) else [(range(len(batch)), result)]
                for positions, scores in parts:
                    positions, scores = list(positions), list(scores)
                    if (
                        len(set(positions)) != len(positions)
                        or delivered.intersection(positions)
                        or not all(0 <= i < len(batch) for i in positions)
                    ):
                        raise ValueError("scorer returned a prompt's score twice, or a position outside the batch")
                    if len(scores) != len(positions):
                        raise ValueError(f"scorer returned {len(scores)} scores for {len(positions)} prompts")
                    now = time.perf_counter()
                    self._deliver([batch[i] for i in positions], scores, None, now - start)
                    delivered.update(positions)
                    start = now
                if len(delivered) != len(batch):
                    raise ValueError(f"scorer returned scores for {len(delivered)} of {len(batch)} prompts")
            except Exception as exc:  # reported to the scheduler; the worker keeps serving
                rest = [batch[i] for i in range(len(batch)) if i not in delivered]
                if rest:
                    self._deliver(rest, [None] * len(rest), exc, time.perf_counter() - start)
