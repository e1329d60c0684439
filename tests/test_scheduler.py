"""The PARS scheduler on vLLM's real v1 Scheduler / AsyncScheduler, driven on the CPU.

A directory with a tiny config.json (and the packaged MiniLM tokenizer) stands in for the served
model; `FakeEngine` stands in for the GPU by answering each SchedulerOutput with a ModelRunnerOutput,
as vLLM's own scheduler tests do. Everything else is vLLM's code and ours."""

from __future__ import annotations

import logging
import math
import re
import time
from collections import defaultdict

import pytest

pytest.importorskip("vllm")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pipeline.serving.cpu_harness import BLOCK, FakeEngine  # noqa: E402


@pytest.fixture(scope="module")
def model_config(tmp_path_factory, tokenizer):
    """A stand-in served model: a tiny llama config.json plus the packaged BERT tokenizer."""
    from pipeline.serving import cpu_harness

    return cpu_harness.model_config(cpu_harness.model_dir(tmp_path_factory.mktemp("tiny-model"), tokenizer=tokenizer))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer, tiny_bert_config):
    """A random checkpoint in the export format, shared by the module (tiny_checkpoint is per test)."""
    from conftest import save_tiny_checkpoint

    return save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt", tiny_bert_config, tokenizer)


@pytest.fixture(scope="module")
def make_scheduler(model_config, checkpoint):
    """Build a real scheduler of `cls` with `num_blocks` KV blocks of 16 tokens."""
    from pipeline.serving.cpu_harness import build_scheduler

    built = []

    def make(cls, *, pars=None, **kwargs):
        sched = build_scheduler(cls, model_config, pars={"checkpoint": str(checkpoint), **(pars or {})}, **kwargs)
        built.append(sched)
        return sched

    yield make
    workers = [s.pars_worker for s in built if getattr(s, "pars_worker", None) is not None]
    for sched in built:  # each background scheduler holds a scoring thread (and its model) until shut down
        sched.shutdown()
    assert not any(w._thread.is_alive() for w in workers)


def _classes():
    from pipeline.serving.vllm_scheduler import PARSAsyncScheduler, PARSScheduler

    return [(PARSScheduler, False), (PARSAsyncScheduler, True)]


CLASSES = pytest.mark.parametrize("which", ["sync", "async"])


def _pick(which):
    return dict(zip(["sync", "async"], _classes()))[which]


# ---------------------------------------------------------------------------- admission order ---
@CLASSES
def test_admission_order_by_ascending_score(make_scheduler, which):
    cls, is_async = _pick(which)
    sched = make_scheduler(cls, max_num_seqs=1, async_scheduling=is_async)
    assert type(sched) is cls
    eng = FakeEngine(sched, is_async)
    scores = {"a": 5.0, "b": 1.0, "c": 4.0, "d": 2.0, "e": 3.0}
    for rid, score in scores.items():
        eng.add(rid, prompt_len=20, out_len=4, score=score)
    eng.run()
    assert eng.order() == ["b", "d", "e", "c", "a"]
    assert sorted(eng.finished) == sorted(scores)


def test_overhead_counts_the_queue_work_vllm_does_inside_schedule(make_scheduler, monkeypatch):
    """pars_stats' overhead is all PARS time on the engine's thread: besides the work before vLLM's
    schedule() it takes the PARS queue's methods that vLLM calls (peek, pop, prepend, add, remove)."""
    from pipeline.serving import pars_queue

    cls, _ = _pick("sync")
    sched = make_scheduler(cls, max_num_seqs=2)
    ticks = iter(range(1, 10**6))
    # every time.perf_counter() reading (process-wide: pars_queue.time is the time module) 1 s later
    # than the last: each timed stretch, however short, counts whole seconds
    monkeypatch.setattr(pars_queue.time, "perf_counter", lambda: float(next(ticks)))
    eng = FakeEngine(sched, False)
    for rid in "abc":
        eng.add(rid, prompt_len=20, out_len=2, score=1.0)
    busy_before = sched.waiting.busy_s
    sched.schedule()
    stats = sched.pars_stats
    inside = sched.waiting.busy_s - busy_before
    assert inside >= 2  # vLLM peeked and popped the two it admitted
    assert stats["last_overhead_s"] >= inside and stats["max_overhead_s"] >= inside
    # the adds' queue time (before this schedule()) is in the total, once
    assert stats["overhead_s"] == pytest.approx(stats["last_overhead_s"] + busy_before)


def test_vllm_fcfs_baseline_differs(make_scheduler):
    """The same workload on vLLM's own Scheduler is served in arrival order (the test can fail)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    eng = FakeEngine(make_scheduler(Scheduler, max_num_seqs=1))
    for rid, score in {"a": 5.0, "b": 1.0, "c": 4.0}.items():
        eng.add(rid, prompt_len=20, out_len=4, score=score)
    eng.run()
    assert eng.order() == ["a", "b", "c"]


def test_checkpoint_scores_in_one_batch_at_schedule(make_scheduler, checkpoint, tokenizer):
    """Inline scoring: token ids are detokenised with the served model's tokenizer and scored together
    in schedule(); add_request only queues. A client-sent score wins over the checkpoint."""
    from pipeline.serving.scorer import Scorer
    from pipeline.serving.vllm_scheduler import PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=1, pars={"scoring": "inline"})
    assert sched.pars_worker is None
    eng = FakeEngine(sched)
    prompts = [
        "write a long essay about the history of rome",
        "say hi",
        "list three colors",
        "explain quantum computing in detail with examples",
        "what is two plus two",
    ]
    for i, text in enumerate(prompts):
        eng.add(f"p{i}", 0, out_len=2, prompt_ids=tokenizer(text)["input_ids"])
    eng.add("client", 0, out_len=2, score=1e9, prompt_ids=tokenizer("say hi")["input_ids"])
    assert sched.pars_stats["num_batches"] == 0  # nothing scored in add_request
    assert not any(hasattr(r, "pars_key") for r in sched.requests.values())
    eng.step()
    assert sched.pars_stats["num_batches"] == 1
    assert sched.pars_stats["num_scored"] == len(prompts)
    assert sched.pars_stats["num_client_scores"] == 1
    eng.run()
    expected = Scorer.from_pretrained(checkpoint).score(prompts)
    assert eng.order() == [f"p{i}" for i in sorted(range(len(prompts)), key=lambda i: expected[i])] + ["client"]


def hold_scoring(sched, batches=None, entered=None):
    """Hold the background scorer until the returned event is set. The worker blocks as it starts a
    batch, before it reads their prompts or whether they finished, so what
    the test does meanwhile happens before that, however the threads are scheduled. Each batch's
    request ids are appended to `batches`; `entered` is set once the worker holds a batch."""
    import threading

    release = threading.Event()
    worker = sched.pars_worker
    real_batch = worker._score_batch

    def held(requests):
        if batches is not None:
            batches.append([r.request_id for r in requests])
        if entered is not None:
            entered.set()
        assert release.wait(10)
        yield from real_batch(requests)

    worker._score_batch = held
    return release


def test_background_scoring_never_waits_and_replaces_requests(make_scheduler, checkpoint, tokenizer):
    """Background scoring: schedule() returns while the ranker is still busy; arrivals wait at a
    provisional place (arrival order, behind a low client score, ahead of a high one) and move to
    their scored place once the worker is done. Every request is scored once and finishes once."""

    from pipeline.serving.scorer import Scorer
    from pipeline.serving.vllm_scheduler import PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=1)
    assert sched.pars_config.scoring == "background" and sched.pars_worker is not None
    release = hold_scoring(sched)
    eng = FakeEngine(sched)
    prompts = [
        "write a long essay about the history of rome",
        "say hi",
        "list three colors",
        "explain quantum computing in detail with examples",
        "what is two plus two",
    ]
    eng.add("first", 0, out_len=2, score=-1e9, prompt_ids=tokenizer("go first")["input_ids"])
    for i, text in enumerate(prompts):
        eng.add(f"p{i}", 0, out_len=2, prompt_ids=tokenizer(text)["input_ids"])
    eng.add("last", 0, out_len=2, score=1e9, prompt_ids=tokenizer("go last")["input_ids"])
    eng.step()  # returns although the ranker is blocked
    assert sched.pars_unscored() == len(prompts)
    assert sched.pars_stats["num_provisional"] == len(prompts)
    waiting = [r.request_id for r in sched.waiting]
    assert waiting == [f"p{i}" for i in range(len(prompts))] + ["last"]  # provisional: arrival order
    release.set()
    assert sched.pars_worker.wait_idle(10)
    eng.run()
    expected = Scorer.from_pretrained(checkpoint).score(prompts)
    assert eng.order() == ["first"] + [f"p{i}" for i in sorted(range(len(prompts)), key=lambda i: expected[i])] + [
        "last"
    ]
    assert sched.pars_stats["num_scored"] == len(prompts)
    assert sorted(eng.finished) == sorted(["first", "last", *(f"p{i}" for i in range(len(prompts)))])


def test_before_any_score_unscored_requests_wait_at_the_checkpoints_typical_score(
    make_scheduler, checkpoint, tokenizer, tmp_path
):
    """At a cold start nothing is scored yet: an arrival waits at the checkpoint's median val score
    (pars.json typical_score, from export), not at 0, which a checkpoint whose scores sit near 100
    would put ahead of every scored request."""
    import json
    import shutil

    from pipeline.ranking.checkpoint import META
    from pipeline.serving.vllm_scheduler import PARSScheduler

    typical = tmp_path / "typical"
    shutil.copytree(checkpoint, typical)
    meta = json.loads((typical / META).read_text())
    (typical / META).write_text(json.dumps({**meta, "typical_score": {"median": 100.0, "split": "val"}}))
    sched = make_scheduler(PARSScheduler, max_num_seqs=1, pars={"checkpoint": str(typical)})
    assert sched.pars_scorer.typical_score == 100.0
    release = hold_scoring(sched)
    eng = FakeEngine(sched)
    eng.add("first", 0, out_len=2, score=-1e9, prompt_ids=tokenizer("go first")["input_ids"])
    eng.add("below", 0, out_len=2, score=99.0, prompt_ids=tokenizer("just below")["input_ids"])
    for i in range(3):
        eng.add(f"p{i}", 0, out_len=2, prompt_ids=tokenizer(f"prompt number {i}")["input_ids"])
    eng.add("above", 0, out_len=2, score=101.0, prompt_ids=tokenizer("just above")["input_ids"])
    eng.step()
    assert [r.request_id for r in sched.waiting] == ["below", "p0", "p1", "p2", "above"]
    release.set()
    assert sched.pars_worker.wait_idle(10)
    eng.run()
    assert sorted(eng.finished) == ["above", "below", "first", "p0", "p1", "p2"]


# ------------------------------------------------------------------------------- starvation ---
@CLASSES
def test_starved_request_goes_first_oldest_first(make_scheduler, which):
    cls, is_async = _pick(which)
    sched = make_scheduler(cls, max_num_seqs=1, async_scheduling=is_async, pars={"starvation_s": 50})
    eng = FakeEngine(sched, is_async)
    eng.add("blocker", 20, out_len=60, score=0.0)
    eng.step()  # blocker runs for ~60 steps
    eng.add("old", 20, out_len=2, score=200.0)
    eng.t += 5
    eng.add("young", 20, out_len=2, score=100.0)
    eng.t += 20
    for i in range(4):
        eng.add(f"short{i}", 20, out_len=2, score=float(i))
    eng.run()
    # When the blocker finishes (t ~ 60) "old" and "young" have waited > 50 s: they go first, oldest
    # first (against their scores), ahead of the shorter-scored requests, which have waited < 50 s.
    assert eng.order() == ["blocker", "old", "young", "short0", "short1", "short2", "short3"]


@CLASSES
def test_a_starved_request_skipped_by_vllm_keeps_its_turn(make_scheduler, which):
    """vLLM skips a waiting request it cannot start yet (a grammar not compiled, a LoRA slot, a KV
    load): popped, then prepended after the step. A starved request skipped so must still go first at
    the next opening, not fall back to its score's place."""
    cls, is_async = _pick(which)
    sched = make_scheduler(cls, max_num_seqs=1, async_scheduling=is_async, pars={"starvation_s": 50})
    blocked = {"old": 1}  # the first time "old" heads the queue it is not ready
    ready = sched._handle_blocked_waiting_request

    def not_ready_once(request):
        if blocked.get(request.request_id, 0) > 0:
            blocked[request.request_id] -= 1
            return False
        return ready(request)

    sched._handle_blocked_waiting_request = not_ready_once
    eng = FakeEngine(sched, is_async)
    eng.add("blocker", 20, out_len=60, score=0.0)
    eng.step()
    eng.add("old", 20, out_len=2, score=200.0)  # the longest score; starved by the time the blocker ends
    eng.t += 25
    for i in range(3):
        eng.add(f"short{i}", 20, out_len=2, score=float(i))
    eng.run()
    assert blocked["old"] == 0  # it was skipped once
    # skipped, "old" lets short0 take the slot; at the next opening it is still starved and goes first
    assert eng.order() == ["blocker", "short0", "old", "short1", "short2"]


def test_starvation_promotes_within_a_priority_level_only(make_scheduler):
    """A starved request goes ahead of its own priority level, never ahead of a more urgent one."""
    from pipeline.serving.vllm_scheduler import PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=1, pars={"starvation_s": 50})
    eng = FakeEngine(sched)
    eng.add("blocker", 20, out_len=60, score=0.0)
    eng.step()
    eng.add("low_old", 20, out_len=2, score=0.0, priority=1)  # waits ~60 steps: starved
    eng.t += 40
    eng.add("urgent", 20, out_len=2, score=500.0, priority=0)  # waits ~20: not starved
    eng.add("low_short", 20, out_len=2, score=-5.0, priority=1)
    eng.run()
    assert eng.order() == ["blocker", "urgent", "low_old", "low_short"]


def test_wait_is_timed_by_the_queue_not_by_arrival_time(make_scheduler):
    """vLLM's own tests stamp arrival_time 0..N (1970): that must not make every request starved."""
    from pipeline.serving.cpu_harness import FakeEngine as Engine
    from pipeline.serving.vllm_scheduler import PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=1, pars={"starvation_s": 120})
    eng = Engine(sched, step_clock=False)  # the queue keeps its real monotonic clock
    for i, score in enumerate([3.0, 1.0, 2.0]):
        eng.add(f"r{i}", 20, out_len=2, score=score, arrival=float(i))
    eng.run()
    assert eng.order() == ["r1", "r2", "r0"]


def test_unstarved_long_request_waits(make_scheduler):
    from pipeline.serving.vllm_scheduler import PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=1, pars={"starvation_s": 1000})
    eng = FakeEngine(sched)
    eng.add("blocker", 20, out_len=60, score=0.0)
    eng.step()
    eng.add("long", 20, out_len=2, score=100.0)
    for i in range(3):
        eng.add(f"short{i}", 20, out_len=2, score=float(i))
    eng.run()
    assert eng.order() == ["blocker", "short0", "short1", "short2", "long"]


# ------------------------------------------------------------------------------- preemption ---
def _preemption_setup(make_scheduler, cls, is_async):
    """Three running requests of one 16-token block each; 4 usable blocks. When they cross into
    their second block, one must be preempted. 'high' (score 9) was admitted first, so vLLM's
    FCFS choice (the last admitted) would be 'low2'."""
    sched = make_scheduler(cls, max_num_seqs=3, num_blocks=5, async_scheduling=is_async)
    eng = FakeEngine(sched, is_async)
    eng.add("high", 12, out_len=30, score=9.0)
    eng.step()
    eng.add("low1", 12, out_len=30, score=1.0)
    eng.add("low2", 12, out_len=30, score=2.0)
    for _ in range(12):
        eng.step()
        if eng.preempted:
            break
    return sched, eng


@CLASSES
def test_preemption_victim_is_highest_score(make_scheduler, which):
    cls, is_async = _pick(which)
    sched, eng = _preemption_setup(make_scheduler, cls, is_async)
    assert eng.preempted, "the KV cache was sized to force a preemption"
    assert eng.preempted[0][1] == "high"
    eng.run()
    assert sorted(eng.finished) == ["high", "low1", "low2"]


def test_vllm_fcfs_preempts_last_admitted(make_scheduler):
    from vllm.v1.core.sched.scheduler import Scheduler

    sched, eng = _preemption_setup(make_scheduler, Scheduler, False)
    assert eng.preempted and eng.preempted[0][1] == "low2"


@CLASSES
def test_preempted_request_requeues_by_score(make_scheduler, which):
    cls, is_async = _pick(which)
    sched, eng = _preemption_setup(make_scheduler, cls, is_async)
    assert [rid for _, rid in eng.preempted] == ["high"]
    eng.add("mid", 12, out_len=2, score=5.0)
    eng.add("top", 12, out_len=2, score=20.0)
    eng.add("first", 12, out_len=2, score=-3.0)
    sched.waiting.flush()
    # vLLM's FCFS would put the preempted request at the very front; PARS puts it back by score.
    assert [r.request_id for r in sched.waiting] == ["first", "mid", "high", "top"]
    eng.run()
    later = [rid for rid in eng.order() if rid in {"first", "mid", "high", "top"}][-4:]
    assert later == ["first", "mid", "high", "top"]


# ----------------------------------------------------------------------------- robustness ---
@pytest.mark.parametrize("scoring", ["inline", "background"])
def test_scoring_failure_keeps_a_provisional_place(make_scheduler, tokenizer, caplog, scoring):
    """Unscorable requests wait in the middle (arrival order, behind a low client score, ahead of a
    high one), never ahead of everything; faults are counted, and logged at a bounded rate."""
    from pipeline.serving.vllm_scheduler import LOGGER_NAME, PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=1, pars={"scoring": scoring})

    def broken(texts, batch_size=None):
        raise RuntimeError("ranker exploded")

    sched.pars_scorer.score_parts = broken  # a fault in our ranker, not a fake of vLLM
    eng = FakeEngine(sched)
    pars_logger = logging.getLogger(LOGGER_NAME)
    pars_logger.addHandler(caplog.handler)  # vLLM's loggers do not propagate to the root logger
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        eng.add("blocker", 0, out_len=2, score=-9.0, prompt_ids=tokenizer("runs first")["input_ids"])
        eng.step()
        for i in range(4):
            eng.add(f"r{i}", 0, out_len=2, prompt_ids=tokenizer(f"prompt number {i}")["input_ids"])
        eng.add("client", 0, out_len=2, score=5.0, prompt_ids=tokenizer("a client-scored prompt")["input_ids"])
        eng.add("low", 0, out_len=2, score=-1.0, prompt_ids=tokenizer("a low client score")["input_ids"])
        eng.step()
        for i in range(4, 6):
            eng.add(f"r{i}", 0, out_len=2, prompt_ids=tokenizer(f"prompt number {i}")["input_ids"])
        eng.step()
        if sched.pars_worker is not None:
            assert sched.pars_worker.wait_idle(10)
        eng.run()
    pars_logger.removeHandler(caplog.handler)
    assert eng.order() == ["blocker", "low"] + [f"r{i}" for i in range(6)] + ["client"]
    assert sorted(eng.finished) == sorted(["blocker", "low", "client", *(f"r{i}" for i in range(6))])
    assert sched.pars_stats["num_client_scores"] == 3
    assert sched.pars_stats["num_fallback"] == 6
    assert sched.pars_stats["num_faults"] >= 1
    # One report per minute at most (the handler may see a record twice: count distinct records).
    warnings = {id(r) for r in caplog.records if "ranker exploded" in r.getMessage()}
    assert len(warnings) == 1


@pytest.mark.parametrize(
    "pars, match",
    [
        ({"batch_size": -1}, "batch_size.*integer >= 1"),
        ({"batch_size": 2.5}, "batch_size.*integer >= 1"),
        ({"starvation_s": 0}, "starvation_s.*> 0"),
        ({"starvation_s": "soon"}, "starvation_s.*number"),
        ({"scoring": "lazy"}, "scoring.*background"),
        ({"batchsize": 8}, "unknown key.*batchsize"),
        ({"device": "gpu0"}, "device.*not a torch device"),
        ({"scorer_threads": -1}, "scorer_threads.*integer >= 0"),
        ({"quantize": "fp4"}, "quantize.*none.*int8"),
    ],
)
def test_bad_config_stops_startup_with_one_line(make_scheduler, pars, match):
    from pipeline.serving.vllm_scheduler import PARSConfigError, PARSScheduler

    with pytest.raises(PARSConfigError, match=match) as info:
        make_scheduler(PARSScheduler, pars=pars)
    assert "\n" not in str(info.value) and "additional_config['pars']" in str(info.value)


def test_a_client_score_that_is_not_a_number_is_ignored_not_fatal(make_scheduler, tokenizer, caplog):
    """An unusable client score is counted and reported (at a bounded rate); the checkpoint scores
    that request and it is served like any other."""
    from pipeline.serving.vllm_scheduler import LOGGER_NAME, PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=1, pars={"scoring": "inline"})
    eng = FakeEngine(sched)
    pars_logger = logging.getLogger(LOGGER_NAME)
    pars_logger.addHandler(caplog.handler)  # vLLM's loggers do not propagate to the root logger
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        eng.add("soon", 0, out_len=2, score="soon", prompt_ids=tokenizer("a prompt")["input_ids"])
        eng.add("flag", 0, out_len=2, score=True, prompt_ids=tokenizer("a flag")["input_ids"])
        eng.add("nan", 0, out_len=2, score=float("nan"), prompt_ids=tokenizer("not a number")["input_ids"])
        eng.add("ok", 0, out_len=2, score=-1.0, prompt_ids=tokenizer("another prompt")["input_ids"])
        eng.run()
    pars_logger.removeHandler(caplog.handler)
    assert sorted(eng.finished) == ["flag", "nan", "ok", "soon"]
    assert sched.pars_stats["num_client_scores"] == 1 and sched.pars_stats["num_scored"] == 3
    assert sched.pars_stats["num_bad_client_scores"] == 3
    reports = {id(r): r.getMessage() for r in caplog.records if "not a finite number" in r.getMessage()}
    assert len(reports) == 1 and "'soon'" in next(iter(reports.values()))


def test_queue_keeps_every_request_when_keying_fails():
    """A fault in the keying function must not drop the requests it was handed."""
    from pipeline.serving.pars_queue import PARSRequestQueue

    class Req:
        def __init__(self, i):
            self.priority, self.arrival_time, self.request_id = 0, float(i), str(i)

    def broken(requests):
        requests[0].pars_key = (0, 1.0)
        raise RuntimeError("boom")

    queue = PARSRequestQueue(broken, starvation_s=100.0)
    reqs = [Req(i) for i in range(3)]
    for r in reqs:
        queue.add_request(r)
    with pytest.raises(RuntimeError, match="boom"):
        queue.flush()
    assert len(queue) == 3
    assert [queue.pop_request().request_id for _ in range(3)] == ["0", "1", "2"]


def test_preempted_request_keeps_its_turn_among_requests_queued_in_the_same_tick():
    """Starved requests go oldest first; between equal times queued, in the order first queued. A
    preempted request re-enters with both, so it does not fall behind requests queued after it."""
    from pipeline.serving.pars_queue import PARSRequestQueue

    class Req:
        def __init__(self, i):
            self.priority, self.arrival_time, self.request_id = 0, 0.0, str(i)

    def by_id(requests):
        for r in requests:
            r.pars_key = (0, float(r.request_id))

    now = [0.0]
    queue = PARSRequestQueue(by_id, starvation_s=5.0, clock=lambda: now[0])
    reqs = [Req(i) for i in range(4)]
    for r in reqs:
        queue.add_request(r)  # all in one tick
    queue.flush()
    first = queue.pop_request()
    assert first.request_id == "0"
    now[0] = 10.0  # every request has starved; "0" is preempted and re-enters
    queue.prepend_request(first)
    queue.flush()
    assert [r.request_id for r in queue] == ["0", "1", "2", "3"]
    assert [queue.pop_request().request_id for _ in range(4)] == ["0", "1", "2", "3"]


class _Req:
    """The little of a vLLM Request that the PARS queue reads."""

    def __init__(self, i, score):
        self.priority, self.arrival_time, self.request_id, self.score = 0, float(i), str(i), score


def _by_score(requests):
    for r in requests:
        r.pars_key = (0, r.score)


def test_dead_queue_entries_hold_no_request():
    """Removal is lazy: the heap entry of an admitted, aborted or re-keyed request stays behind an
    old waiting request until compaction. It must not keep the request (its token lists, block
    hashes) alive meanwhile."""
    import gc
    import weakref

    from pipeline.serving.pars_queue import PARSRequestQueue

    queue = PARSRequestQueue(_by_score, starvation_s=1e9)
    old = _Req(0, 0.0)  # the oldest: it heads the age heap, so nothing queued later reaches its top
    queue.add_request(old)
    gone = []
    for i in range(1, 31):  # 30 dead entries: below the compaction threshold
        request = _Req(i, -1.0 if i % 3 == 0 else float(i))
        queue.add_request(request)
        queue.flush()
        if i % 3 == 0:
            assert queue.pop_request() is request  # admitted (it heads the score heap)
        elif i % 3 == 1:
            queue.remove_request(request)  # aborted
        else:
            request.pars_key = (0, float(i) + 0.5)
            assert queue.rekey(request)  # a late score: its old entry dies, the request stays
            continue
        gone.append(weakref.ref(request))
    del request
    gc.collect()
    assert [ref() for ref in gone] == [None] * len(gone)
    dead = [e[-1] for e in queue._by_age + queue._by_score if not e[-1].alive]
    assert dead and all(entry.request is None for entry in dead)
    # the queue still serves what is left, in order
    assert [queue.pop_request().request_id for _ in range(len(queue))] == ["0"] + [
        str(i) for i in range(1, 31) if i % 3 == 2
    ]


def test_scoring_worker_close_drops_the_backlog_and_joins():
    import threading

    from pipeline.serving.scoring_worker import ScoringWorker

    gate = threading.Event()

    def slow(items):
        gate.wait(5)
        return [1.0] * len(items)

    worker = ScoringWorker(slow, batch_size=1)
    for i in range(5):
        worker.submit(i)
    gate.set()
    worker.close(timeout=5)
    assert not worker._thread.is_alive() and worker.backlog == 0
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit(9)


def test_scoring_worker_closed_again_after_a_timed_out_join_counts_no_stop_marker():
    """close() whose join times out (a batch still scoring) leaves its stop marker queued; a second
    close() must not count that marker as a dropped item, or the backlog goes negative."""
    import threading

    from pipeline.serving.scoring_worker import ScoringWorker

    gate, started = threading.Event(), threading.Event()

    def slow(items):
        started.set()
        gate.wait(5)
        return [1.0] * len(items)

    worker = ScoringWorker(slow, batch_size=1)
    worker.submit(0)
    assert started.wait(5)
    worker.close(timeout=0.01)  # the batch in hand is still scoring: the join times out
    assert worker._thread.is_alive()
    worker.close(timeout=0.01)
    gate.set()
    worker._thread.join(5)
    assert not worker._thread.is_alive() and worker.backlog == 0 and worker.wait_idle(1)


def test_scoring_worker_delivers_parts_as_they_finish():
    """A scorer that yields (positions, scores) parts: each part reaches take() as soon as it is
    yielded; a failure mid-batch reports only the prompts not yet delivered; a repeated position or
    one outside the batch is an error, not a double count."""
    import threading

    from pipeline.serving.scoring_worker import ScoringWorker

    gate = threading.Event()

    def parts(items):
        yield [1], [10.0]
        assert gate.wait(5)
        if items[0] == "boom":
            raise RuntimeError("second forward pass failed")
        if items[0] == "twice":
            yield [1], [10.0]
        if items[0] == "inner":
            yield [0, 0], [0.0, 0.0]
        if items[0] == "outside":
            yield [-1], [0.0]
        yield [0, 2], [0.0, 20.0]

    worker = ScoringWorker(parts, batch_size=3)
    first = _submit_while_held(worker, "a", "b", "c")
    deadline = time.monotonic() + 5
    while not first and time.monotonic() < deadline:
        first = worker.take()
        time.sleep(0.01)
    assert [(b.items, b.scores) for b in first] == [(["b"], [10.0])]  # before the rest is released
    assert worker.backlog == 2
    gate.set()
    assert worker.wait_idle(5)
    assert [(b.items, b.scores, b.error) for b in worker.take()] == [(["a", "c"], [0.0, 20.0], None)]
    for head in ("boom", "twice", "inner", "outside"):
        got = _submit_while_held(worker, head, "x", "y")
        assert worker.wait_idle(5)
        got += worker.take()
        assert [b.items for b in got] == [["x"], [head, "y"]] and got[1].scores == [None, None]
        assert isinstance(got[1].error, (RuntimeError, ValueError)) and worker.backlog == 0
    worker.close()


def _submit_while_held(worker, *items) -> list:
    """Submit items so that the worker takes them as one batch, however the threads are scheduled:
    it is held scoring a batch of its own meanwhile. That batch is taken back here; the batches
    taken with it (of the items) are returned."""
    import threading

    entered, release = threading.Event(), threading.Event()
    real_batch = worker._score_batch

    def holding(batch):
        entered.set()
        assert release.wait(5)
        return [0.0] * len(batch)

    worker._score_batch = holding
    worker.submit("hold")
    assert entered.wait(5)  # the worker holds ["hold"] alone; the items below wait in its inbox
    worker._score_batch = real_batch  # read by the worker as it starts its next batch
    for item in items:
        worker.submit(item)
    release.set()
    taken, deadline = [], time.monotonic() + 5
    while not taken and time.monotonic() < deadline:
        taken = worker.take()
        time.sleep(0.001)
    assert taken and taken[0].items == ["hold"]
    return taken[1:]


def test_scoring_worker_batches_what_first_picks_ahead_of_older_items():
    """`first(item)` items go into the next batch before older ones (arrival order within each)."""
    from pipeline.serving.scoring_worker import ScoringWorker

    worker = ScoringWorker(lambda items: [1.0] * len(items), batch_size=2, first=lambda item: item.startswith("w"))
    got = _submit_while_held(worker, "r1", "w1", "r2", "w2", "r3")
    assert worker.wait_idle(5)
    got += worker.take()
    assert [b.items for b in got] == [["w1", "w2"], ["r1", "r2"], ["r3"]]
    worker.close()


def test_scoring_worker_survives_a_failing_thread_init_first_and_short_scorer():
    """What the worker is handed may fail; the worker never dies: a failing thread_init is kept in
    init_error, a failing `first` costs only the order (arrival order), a scorer that returns too few
    scores fails that batch alone, and a batch size below 1 is refused."""
    from pipeline.serving.scoring_worker import ScoringWorker

    def boom(*_):
        raise RuntimeError("no threads for you")

    worker = ScoringWorker(lambda items: [1.0] * len(items), batch_size=4, thread_init=boom, first=boom)
    got = _submit_while_held(worker, "b", "a")
    assert worker.wait_idle(5)
    got += worker.take()
    assert isinstance(worker.init_error, RuntimeError) and [b.items for b in got] == [["b", "a"]]
    assert got[0].scores == [1.0, 1.0] and got[0].error is None
    worker.close()

    worker = ScoringWorker(lambda items: [1.0] * (len(items) - 1), batch_size=4)
    got = _submit_while_held(worker, "x", "y")
    assert worker.wait_idle(5)
    got += worker.take()
    assert [(b.items, b.scores) for b in got] == [(["x", "y"], [None, None])]
    assert "scorer returned 1 scores for 2 prompts" in str(got[0].error)
    worker.close()
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ScoringWorker(lambda items: [], batch_size=0)


def test_queue_compacts_dead_entries_and_keeps_its_order():
    """Past 64 dead heap entries (and twice the live ones) the heaps are rebuilt from the live ones:
    they stay O(live) under a long run of admissions, aborts and late scores, and the order holds."""
    from pipeline.serving.pars_queue import PARSRequestQueue

    queue = PARSRequestQueue(_by_score, starvation_s=1e9)
    kept, compactions, dead_before = [], 0, 0
    for i in range(300):
        request = _Req(i, -1.0 if i % 3 == 0 else float(i))
        queue.add_request(request)
        queue.flush()
        if i % 3 == 0:
            assert queue.pop_request() is request
        elif i % 3 == 1:
            queue.remove_request(request)
        else:
            request.pars_key = (0, 1000.0 - i)  # a late score, in reverse arrival order
            assert queue.rekey(request)
            kept.append(request.request_id)
        compactions += queue._dead < dead_before
        dead_before = queue._dead
        bound = len(queue) + max(64, 2 * len(queue)) + 1  # live entries, and the dead ones compaction allows
        assert len(queue._by_score) <= bound and len(queue._by_age) <= bound
    assert len(queue) == 100 and compactions >= 2
    assert [queue.pop_request().request_id for _ in range(len(queue))] == kept[::-1]


def test_scoring_worker_counts_an_item_once_when_close_and_a_batch_end_together():
    """close() (the caller's thread) and the worker both add to the count of finished items. Here
    each pauses inside its addition until the other has begun one (or 0.5 s): without a lock both
    would add to the same old count, one item would be lost, and wait_idle would never return."""
    import threading

    from pipeline.serving.scoring_worker import ScoringWorker

    both_adding = threading.Barrier(2, timeout=0.5)

    class SlowCount(int):
        def __add__(self, other):
            try:
                both_adding.wait()
            except threading.BrokenBarrierError:
                pass  # the other one waits for the lock: the additions are serialised
            return int(self) + other

    entered, release = threading.Event(), threading.Event()

    def held(items):
        entered.set()
        assert release.wait(5)
        return [1.0] * len(items)

    worker = ScoringWorker(held, batch_size=1)
    worker.submit("scored")
    assert entered.wait(5)
    worker.submit("dropped")  # stays in the inbox: close() drops it
    worker._finished = SlowCount(0)
    release.set()  # the worker counts "scored" while close() counts "dropped"
    worker.close(timeout=5)
    assert not worker._thread.is_alive() and worker.backlog == 0


def test_a_request_aborted_before_its_score_is_no_fault(make_scheduler, tokenizer):
    """A request that finishes (here: is aborted) before the background scorer reaches it needs no
    score: it is counted apart, not as a scoring fault or a fallback."""

    from vllm.v1.request import RequestStatus

    from pipeline.serving.vllm_scheduler import PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=1)
    release = hold_scoring(sched)
    eng = FakeEngine(sched)
    eng.add("first", 0, out_len=2, score=-1e9, prompt_ids=tokenizer("go first")["input_ids"])
    for i, text in enumerate(["say hi", "write an essay", "list colors"]):
        eng.add(f"p{i}", 0, out_len=2, prompt_ids=tokenizer(text)["input_ids"])
    eng.step()  # the worker holds p0..p2
    sched.finish_requests("p1", RequestStatus.FINISHED_ABORTED)
    release.set()
    assert sched.pars_worker.wait_idle(10)
    eng.step()  # takes the scores
    stats = sched.pars_stats
    assert (stats["num_scored"], stats["num_finished_unscored"]) == (2, 1)
    assert stats["num_faults"] == 0 and stats["num_fallback"] == 0


def test_waiting_requests_are_scored_before_running_ones(make_scheduler, tokenizer):
    """Under a backlog the worker scores requests still waiting (their score decides when they run)
    before one admitted on its provisional score; that one is scored after them, not dropped (its
    score orders `running`, and so the preemption victim)."""
    import threading

    from pipeline.serving.vllm_scheduler import PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=2, pars={"batch_size": 1})  # 8 per worker batch
    batches, entered = [], threading.Event()
    from vllm.v1.request import RequestStatus

    release = hold_scoring(sched, batches, entered)
    eng = FakeEngine(sched)
    eng.add("w", 0, out_len=50, prompt_ids=tokenizer("keeps the worker busy")["input_ids"])
    eng.step()
    assert entered.wait(10)  # the worker holds ["w"]; the arrivals below queue up behind it
    for i in range(9):
        eng.add(f"r{i}", 0, out_len=50, prompt_ids=tokenizer(f"prompt number {i}")["input_ids"])
    eng.step()  # admits r0 (provisional keys tie: arrival order) into the second slot
    assert sched.requests["r0"].status == RequestStatus.RUNNING
    release.set()
    assert sched.pars_worker.wait_idle(10)
    assert batches == [["w"], [f"r{i}" for i in range(1, 9)], ["r0"]]
    eng.step()
    assert sched.pars_stats["num_scored"] == 10 and sched.pars_stats["num_fallback"] == 0


def test_scorer_thread_uses_its_own_torch_threads(make_scheduler, tokenizer):
    """The background scorer runs with scorer_threads torch threads (1 by default: a second OpenMP
    pool slows every engine step on a shared CPU) and leaves the engine thread's count alone."""
    import torch

    from pipeline.serving.vllm_scheduler import PARSScheduler

    main_threads = torch.get_num_threads()
    sched = make_scheduler(PARSScheduler)
    assert sched.pars_config.scorer_threads == 1
    assert _scorer_threads_seen(sched, tokenizer) == [1] and torch.get_num_threads() == main_threads


def _scorer_threads_seen(sched, tokenizer) -> list[int]:
    """The torch thread counts the scorer thread scored a request with."""
    import torch

    seen = []
    real_parts = sched.pars_scorer.score_parts

    def recording(texts, *args, **kw):
        seen.append(torch.get_num_threads())
        yield from real_parts(texts, *args, **kw)

    sched.pars_scorer.score_parts = recording
    eng = FakeEngine(sched)
    eng.add("a", 0, out_len=1, prompt_ids=tokenizer("how are you")["input_ids"])
    eng.step()
    assert sched.pars_worker.wait_idle(10)
    eng.run()
    return seen


def test_scorer_threads_past_the_cores_are_cut_to_them(make_scheduler, tokenizer):
    """A config shared with larger hosts starts here too: more scorer threads than this process may
    use would only slow the engine, so the scorer takes the cores there are."""
    import os

    import torch

    from pipeline.serving.vllm_scheduler import PARSScheduler

    main_threads = torch.get_num_threads()
    sched = make_scheduler(PARSScheduler, pars={"scorer_threads": 1000})
    assert _scorer_threads_seen(sched, tokenizer) == [len(os.sched_getaffinity(0))]
    assert torch.get_num_threads() == main_threads


def test_bad_config_from_environment_names_the_variable(make_scheduler, monkeypatch):
    from pipeline.serving.vllm_scheduler import PARSConfigError, PARSScheduler

    monkeypatch.setenv("PARS_BATCH_SIZE", "0")
    with pytest.raises(PARSConfigError, match="PARS_BATCH_SIZE"):
        make_scheduler(PARSScheduler)


def test_missing_checkpoint_stops_startup(make_scheduler, model_config, tmp_path, monkeypatch):
    from pipeline.ranking.checkpoint import CheckpointError
    from pipeline.serving.cpu_harness import build_scheduler
    from pipeline.serving.vllm_scheduler import PARSScheduler

    monkeypatch.delenv("PARS_CHECKPOINT", raising=False)
    with pytest.raises(CheckpointError, match="does not exist"):
        make_scheduler(PARSScheduler, pars={"checkpoint": str(tmp_path / "nope")})
    with pytest.raises(CheckpointError, match="needs a checkpoint"):
        build_scheduler(PARSScheduler, model_config, pars={})


def test_corrupt_checkpoint_stops_startup(make_scheduler, tiny_checkpoint):
    from pipeline.ranking.checkpoint import CheckpointError
    from pipeline.serving.vllm_scheduler import PARSScheduler

    weights = tiny_checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10:] = b"\x00" * 10
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        make_scheduler(PARSScheduler, pars={"checkpoint": str(tiny_checkpoint)})


def test_config_from_additional_config_and_env(make_scheduler, checkpoint, monkeypatch):
    from pipeline.serving.vllm_scheduler import PARSScheduler

    monkeypatch.setenv("PARS_STARVATION_S", "7.5")
    monkeypatch.setenv("PARS_BATCH_SIZE", "3")
    sched = make_scheduler(PARSScheduler, pars={"batch_size": 5})
    assert sched.pars_config.starvation_s == 7.5  # from the environment
    assert sched.pars_config.batch_size == 5  # additional_config wins
    assert sched.pars_scorer.batch_size == 5
    assert sched.waiting.starvation_s == 7.5
    monkeypatch.delenv("PARS_STARVATION_S")
    assert make_scheduler(PARSScheduler).pars_config.starvation_s == 120.0


def test_a_null_or_empty_setting_is_refused_not_defaulted(make_scheduler, monkeypatch):
    """A key given without a value is a mistake, not "the default" (nor the environment's value);
    `"starvation_s": null` alone has a meaning: no starvation rule, as in the simulator's params."""
    from pipeline.serving.pars_config import PARSConfig, PARSConfigError
    from pipeline.serving.vllm_scheduler import PARSScheduler

    for section, env, match in [
        (None, {"PARS_STARVATION_S": ""}, "environment variable PARS_STARVATION_S must be a number, got ''"),
        (None, {"PARS_SCORING": ""}, "environment variable PARS_SCORING must be one of"),
        ({"batch_size": None}, {"PARS_BATCH_SIZE": "4"}, r"\['batch_size'\] must be a number, got None"),
        ({"checkpoint": None}, {}, r"\['checkpoint'\] must be a non-empty string, got None"),
        ({"fault_log_interval_s": None}, {}, r"\['fault_log_interval_s'\] must be a number, got None"),
    ]:
        with pytest.raises(PARSConfigError, match=match) as info:
            PARSConfig.from_sources(section, env=env)
        assert "\n" not in str(info.value)
    assert PARSConfig.from_sources({"starvation_s": None}, env={"PARS_STARVATION_S": "7"}).starvation_s == math.inf
    assert PARSConfig.from_sources(None, env={"PARS_STARVATION_S": "inf"}).starvation_s == math.inf
    assert PARSConfig(starvation_s=None).starvation_s == math.inf
    monkeypatch.setenv("PARS_STARVATION_S", "7")
    assert make_scheduler(PARSScheduler, pars={"starvation_s": None}).waiting.starvation_s == math.inf


def test_scorer_threads_with_inline_scoring_is_refused():
    """scorer_threads sets the background scorer thread's torch threads: with inline scoring there
    is no such thread, and the setting would be ignored without a word."""
    from pipeline.serving.pars_config import PARSConfig, PARSConfigError

    for section, env in [
        ({"scoring": "inline", "scorer_threads": 4}, {}),
        ({"scoring": "inline"}, {"PARS_SCORER_THREADS": "0"}),
        (None, {"PARS_SCORING": "inline", "PARS_SCORER_THREADS": "2"}),
    ]:
        with pytest.raises(PARSConfigError, match="scorer_threads.*'inline'") as info:
            PARSConfig.from_sources(section, env=env)
        assert "\n" not in str(info.value)
    assert PARSConfig.from_sources({"scoring": "inline"}, env={}).scorer_threads == 1  # the default: fine
    assert PARSConfig.from_sources({"scorer_threads": 4}, env={}).scorer_threads == 4  # background


def test_async_class_builds_sync_twin_without_async_scheduling(make_scheduler):
    from pipeline.serving.vllm_scheduler import PARSAsyncScheduler, PARSScheduler

    assert type(make_scheduler(PARSAsyncScheduler, async_scheduling=False)) is PARSScheduler
    assert type(make_scheduler(PARSAsyncScheduler, async_scheduling=True)) is PARSAsyncScheduler


def test_version_guard(monkeypatch):
    from pipeline.serving.vllm_scheduler import TESTED_VLLM_SPEC, check_vllm_version

    check_vllm_version("0.32.0")
    check_vllm_version("0.32.3+cpu")
    monkeypatch.delenv("PARS_ALLOW_UNTESTED_VLLM", raising=False)
    for bad in ("0.31.9", "0.33.0", "1.0.0"):
        with pytest.raises(RuntimeError, match=re.escape(TESTED_VLLM_SPEC)):
            check_vllm_version(bad)
    monkeypatch.setenv("PARS_ALLOW_UNTESTED_VLLM", "1")
    check_vllm_version("0.33.0")


def test_package_import_does_not_need_vllm():
    import subprocess
    import sys

    code = (
        "import sys, pipeline, pipeline.serving, pipeline.ranking.checkpoint; "
        "assert 'vllm' not in sys.modules, 'vllm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------- property: no loss ---
@st.composite
def workloads(draw):
    n = draw(st.integers(1, 14))
    reqs = []
    for i in range(n):
        reqs.append(
            dict(
                rid=f"q{i}",
                at=draw(st.integers(0, 40)),  # arrival step
                prompt=draw(st.integers(1, 60)),
                out=draw(st.integers(1, 40)),
                score=draw(st.one_of(st.none(), st.floats(-5, 5, allow_nan=False))),
                abort_at=draw(st.one_of(st.none(), st.integers(0, 80))) if draw(st.integers(0, 9)) == 0 else None,
            )
        )
    return dict(
        reqs=reqs,
        max_num_seqs=draw(st.integers(1, 4)),
        num_blocks=draw(st.integers(8, 40)),
        threshold=draw(st.integers(5, 60)),
        which=draw(st.sampled_from(["sync", "async"])),
    )


def _workload(spec: list[tuple], **engine) -> dict:
    keys = ("at", "prompt", "out", "score", "abort_at")
    return dict(reqs=[dict(rid=f"q{i}", **dict(zip(keys, r))) for i, r in enumerate(spec)], **engine)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
# Found by CI: q1, preempted at step 29 after all nine requests had starved, fell behind q3 (queued in
# the same tick, preempted earlier) when re-entering took a new tie-break; it is kept now.
@example(
    w=_workload(
        [(0, 1, 1, None, None), (0, 23, 30, None, None), (0, 1, 1, None, None), (0, 25, 30, None, None)]
        + [(0, 1, 1, None, None), (0, 48, 28, None, None)]
        + [(0, 1, 1, None, None)] * 3,
        max_num_seqs=2,
        num_blocks=8,
        threshold=5,
        which="sync",
    )
)
@given(w=workloads())
def test_property_every_request_finishes_once_and_starvation_is_bounded(make_scheduler, w):
    from vllm.v1.request import RequestStatus

    cls, is_async = _pick(w["which"])
    # Every request must fit alone in the KV cache (else vLLM itself could never serve it).
    usable = (w["num_blocks"] - 1) * BLOCK
    reqs = [r for r in w["reqs"] if r["prompt"] + r["out"] + 2 <= usable]
    if not reqs:
        return
    sched = make_scheduler(
        cls,
        max_num_seqs=w["max_num_seqs"],
        num_blocks=w["num_blocks"],
        async_scheduling=is_async,
        pars={"starvation_s": w["threshold"]},
    )
    eng = FakeEngine(sched, is_async)
    by_step = defaultdict(list)
    for r in reqs:
        by_step[r["at"]].append(r)
    aborts = defaultdict(list)
    for r in reqs:
        if r["abort_at"] is not None:
            aborts[r["at"] + r["abort_at"]].append(r["rid"])
    aborted: set[str] = set()
    last = max(r["at"] for r in reqs)
    for step in range(5000):
        for r in by_step.get(step, ()):
            eng.add(r["rid"], r["prompt"], r["out"], score=r["score"])
        for rid in aborts.get(step, ()):
            if rid in sched.requests:
                aborted.update(q.request_id for q in sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED))
        if step > last and not sched.has_requests() and not eng.in_flight:
            break
        eng.step()
    else:
        raise AssertionError("engine did not drain")

    ids = [r["rid"] for r in reqs]
    done = eng.finished + sorted(aborted)
    assert sorted(done) == sorted(ids), "every request finishes exactly once, none lost"
    assert not sched.requests and not sched.running and len(sched.waiting) == 0

    # Starvation bound. A waiting episode of X starts at its arrival (or preemption). Once X has
    # waited past the threshold and every older request has been admitted, X heads the queue and
    # nothing younger can pass it; within one request's service every request then running has
    # finished or been preempted, so X is admitted. +2 steps: the step a slot frees, and the
    # async scheduler's one step in flight.
    service = max(r["out"] for r in reqs) + 2
    arrival = eng.arrival
    entries = defaultdict(list)
    for rid in ids:
        entries[rid].append(arrival[rid])
    for t, rid in eng.preempted:
        entries[rid].append(t)
    admissions = defaultdict(list)
    for t, rid in eng.admitted:
        admissions[rid].append(t)
    for rid in ids:
        if rid in aborted:
            continue
        for entry, admitted in zip(sorted(entries[rid]), sorted(admissions[rid])):
            older = [t for t, other in eng.admitted if arrival[other] < arrival[rid] and t <= admitted]
            head_since = max([entry, arrival[rid] + w["threshold"], *older])
            assert admitted <= math.floor(head_since) + service, (rid, entry, admitted, head_since)
    sched.shutdown()  # its scoring thread, now rather than at the module's end (40 examples)


def test_starved_request_is_not_the_preemption_victim(make_scheduler):
    """Promoted for starvation, a long request must not be thrown out again by the highest-score
    preemption rule: the victim is the highest-scored request that did not starve."""
    from pipeline.serving.vllm_scheduler import PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=2, num_blocks=5, pars={"starvation_s": 5})
    eng = FakeEngine(sched)
    eng.add("low1", 12, out_len=8, score=1.0)
    eng.add("low2", 12, out_len=40, score=2.0)
    eng.add("high", 12, out_len=40, score=9.0)
    eng.run()
    admitted = eng.order()
    assert admitted[:3] == ["low1", "low2", "high"]  # high got in by starving (> 5 steps)
    assert eng.preempted, "the KV cache was sized to force a preemption"
    assert eng.preempted[0][1] == "low2"
    assert "high" not in {rid for _, rid in eng.preempted}
    assert sorted(eng.finished) == ["high", "low1", "low2"]


def test_chat_template_is_stripped_before_scoring():
    """The ranker was trained on raw prompts: the served model's chat template is taken off."""
    from pipeline.serving.vllm_scheduler import _strip_chat_template

    class ChatML:  # the shape of SmolLM2's template, with its default system prompt
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
            return (
                "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n"
                + body
                + ("<|im_start|>assistant\n" if add_generation_prompt else "")
            )

    strip = _strip_chat_template(ChatML())
    templated = ChatML().apply_chat_template(
        [{"role": "user", "content": "Write a poem\nabout Rome."}], tokenize=False, add_generation_prompt=True
    )
    assert strip(templated) == "Write a poem\nabout Rome."
    assert strip("plain completion prompt") is None  # scored whole by the caller

    class NoTemplate:
        def apply_chat_template(self, *a, **k):
            raise ValueError("no chat template")

    assert _strip_chat_template(NoTemplate()) is None


# SmolLM2-135M-Instruct's chat template (the packaged model the engine tests serve), verbatim
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_a_multi_turn_prompt_is_not_taken_for_the_users_message():
    """A multi-turn chat with the default system prompt starts with the learned prefix and ends with
    the learned suffix too: it must give None (scored whole, counted), not the turns' markup."""
    from transformers import AutoTokenizer

    from pipeline.ranking.model import resolve_encoder
    from pipeline.serving.vllm_scheduler import _strip_chat_template

    chat = AutoTokenizer.from_pretrained(resolve_encoder("minilm-l6"))  # a fresh one: the fixture is shared
    chat.chat_template = SMOLLM2_CHAT_TEMPLATE
    strip = _strip_chat_template(chat)

    def render(messages):
        return chat.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    question = "Write a poem\nabout Rome."
    assert strip(render([{"role": "user", "content": question}])) == question
    turns = [
        {"role": "user", "content": "Name a city."},
        {"role": "assistant", "content": "Rome."},
        {"role": "user", "content": question},
    ]
    multi_turn = render(turns)
    assert multi_turn.startswith(render(turns[:1])[: -len("Name a city.<|im_end|>\n<|im_start|>assistant\n")])
    assert multi_turn.endswith(question + "<|im_end|>\n<|im_start|>assistant\n")  # prefix and suffix match
    assert strip(multi_turn) is None
    assert strip(render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}])) is None


def test_prompts_the_chat_template_does_not_match_are_counted(make_scheduler, tokenizer):
    """A prompt the learned template does not match is scored whole (special tokens dropped) and
    counted, so a template that renders differently per call shows in pars_stats."""
    from pipeline.serving.vllm_scheduler import PARSScheduler

    sched = make_scheduler(PARSScheduler, pars={"scoring": "inline"})
    ids = tokenizer("say hi")["input_ids"]
    assert sched._pars_user_text is None  # the test tokenizer has no chat template: nothing to match
    assert sched._pars_prompt_text(ids) == "say hi" and sched.pars_stats["num_template_unmatched"] == 0
    sched._pars_user_text = lambda text: None  # a template that matches nothing
    assert sched._pars_prompt_text(ids) == "say hi" and sched.pars_stats["num_template_unmatched"] == 1
    sched._pars_user_text = lambda text: "the user's message"
    assert sched._pars_prompt_text(ids) == "the user's message"
    assert sched.pars_stats["num_template_unmatched"] == 1


# ------------------------------------------------------------------- partial scoring faults ---
def test_one_bad_prompt_or_nan_score_costs_only_that_request(make_scheduler, tokenizer, caplog):
    """Inline scoring of one batch: a prompt that cannot be decoded and a prompt the checkpoint
    scores NaN each stay at the provisional place and are counted; the rest of the batch is scored
    and ordered. A scorer that returns the wrong number of scores is a counted fault, not a crash."""
    from pipeline.serving.vllm_scheduler import LOGGER_NAME, PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=1, pars={"scoring": "inline"})
    bad_ids = tokenizer("undecodable")["input_ids"]
    real_text = sched._pars_prompt_text

    def text(ids):
        if list(ids) == bad_ids:
            raise ValueError("cannot decode")
        return real_text(ids)

    sched._pars_prompt_text = text
    real_parts = sched.pars_scorer.score_parts

    def nan_for_the_poem(texts, *args, **kw):
        for rows, values in real_parts(texts, *args, **kw):
            yield rows, [math.nan if "poem" in texts[r] else v for r, v in zip(rows, values)]

    sched.pars_scorer.score_parts = nan_for_the_poem
    eng = FakeEngine(sched)
    eng.add("blocker", 0, out_len=1, score=-1e9, prompt_ids=tokenizer("runs first")["input_ids"])
    eng.step()
    eng.add("bad", 0, out_len=1, prompt_ids=bad_ids)
    eng.add("nan", 0, out_len=1, prompt_ids=tokenizer("a poem")["input_ids"])
    for i, words in enumerate(["say hi", "write an essay on rivers", "list colors"]):
        eng.add(f"ok{i}", 0, out_len=1, prompt_ids=tokenizer(words)["input_ids"])
    requests = {rid: sched.requests[rid] for rid in ["bad", "nan", "ok0", "ok1", "ok2"]}
    eng.run()
    stats = sched.pars_stats
    assert sorted(eng.finished) == ["bad", "blocker", "nan", "ok0", "ok1", "ok2"]
    assert (stats["num_scored"], stats["num_fallback"], stats["num_faults"]) == (3, 2, 1)
    assert [requests[r].pars_score is None for r in requests] == [True, True, False, False, False]

    def short(texts, *args, **kw):
        yield list(range(len(texts))), [0.0] * (len(texts) - 1)

    sched.pars_scorer.score_parts = short
    pars_logger = logging.getLogger(LOGGER_NAME)
    pars_logger.addHandler(caplog.handler)  # vLLM's loggers do not propagate to the root logger
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        sched._pars_last_log.clear()  # the earlier fault's report must not hold this one back
        eng.add("a", 0, out_len=1, prompt_ids=tokenizer("one more")["input_ids"])
        eng.add("b", 0, out_len=1, prompt_ids=tokenizer("and another")["input_ids"])
        eng.run()
    pars_logger.removeHandler(caplog.handler)
    assert sorted(eng.finished)[:2] == ["a", "b"] and stats["num_faults"] == 2 and stats["num_fallback"] == 4
    assert any("scorer returned 1 scores for 2 prompts" in r.getMessage() for r in caplog.records)


def test_without_a_tokenizer_only_client_scores_order_the_queue(model_config, checkpoint, tokenizer, tmp_path):
    """skip_tokenizer_init: nothing to score prompts from. Client scores order the queue, the other
    requests wait at the provisional place in arrival order and are counted as fallbacks."""
    from vllm.config import ModelConfig

    from pipeline.serving import cpu_harness
    from pipeline.serving.vllm_scheduler import PARSScheduler

    no_tokenizer = ModelConfig(
        model=model_config.model, dtype="float32", seed=0, max_model_len=4096, skip_tokenizer_init=True
    )
    sched = cpu_harness.build_scheduler(
        PARSScheduler, no_tokenizer, max_num_seqs=1, pars={"checkpoint": str(checkpoint), "scoring": "inline"}
    )
    assert sched.pars_tokenizer is None
    eng = FakeEngine(sched)
    eng.add("blocker", 0, out_len=1, score=-1e9, prompt_ids=tokenizer("runs first")["input_ids"])
    eng.step()
    eng.add("u0", 0, out_len=1, prompt_ids=tokenizer("write an essay")["input_ids"])
    eng.add("high", 0, out_len=1, score=1e9, prompt_ids=tokenizer("client says long")["input_ids"])
    eng.add("u1", 0, out_len=1, prompt_ids=tokenizer("say hi")["input_ids"])
    eng.add("low", 0, out_len=1, score=-1e8, prompt_ids=tokenizer("client says short")["input_ids"])
    eng.run()
    assert eng.order() == ["blocker", "low", "u0", "u1", "high"]
    stats = sched.pars_stats
    assert (stats["num_client_scores"], stats["num_fallback"], stats["num_scored"]) == (3, 2, 0)
    sched.shutdown()


def test_a_late_score_keeps_a_starved_request_first_and_reorders_running(make_scheduler, tokenizer):
    """Background scoring: a request promoted for waiting too long keeps its place at the front when
    its score arrives; a request admitted on its provisional key is re-sorted in `running` by its real
    score (the last in `running` is vLLM's preemption victim)."""
    import math

    from pipeline.serving.vllm_scheduler import PARSScheduler

    sched = make_scheduler(PARSScheduler, max_num_seqs=3, pars={"starvation_s": 3})
    sched._pars_typical_score = 1e10  # unscored requests wait (and run) above the client's 1e9 until scored
    release = hold_scoring(sched)
    eng = FakeEngine(sched)
    eng.add("long", 0, out_len=60, score=1e9, prompt_ids=tokenizer("a long client job")["input_ids"])
    eng.add("late", 0, out_len=60, prompt_ids=tokenizer("admitted before its score")["input_ids"])
    eng.add("short", 0, out_len=5, prompt_ids=tokenizer("done soon")["input_ids"])
    eng.step()  # all three admitted, "late" and "short" on the provisional key; the worker holds them
    eng.add("starved", 0, out_len=30, prompt_ids=tokenizer("waits too long")["input_ids"])
    eng.add("busy", 0, out_len=40, score=-1e9, prompt_ids=tokenizer("short client job")["input_ids"])
    starved = sched.requests["starved"]
    for _ in range(6):
        eng.step()  # "short" ends; "starved", the oldest waiting past 3 steps, takes its slot before "busy"
    assert starved.pars_starved and [r.request_id for r in sched.running] == ["starved", "long", "late"]
    release.set()
    assert sched.pars_worker.wait_idle(10)
    eng.step()  # takes the scores
    assert starved.pars_score is not None and starved.pars_key[1] == -math.inf  # kept the front
    assert [r.request_id for r in sched.running] == ["starved", "late", "long"]
    eng.run()
    assert sorted(eng.finished) == ["busy", "late", "long", "short", "starved"]
    sched.shutdown()
