"""pytest plugin that runs vLLM's own scheduler tests (tests/v1/core/, unmodified) against PARS.

Loaded by tests/test_vllm_conformance.py in a subprocess whose working directory is the extracted vLLM
tests (scripts/fetch_vllm_tests.py):

    cd .cache/vllm-tests/0.32.0 && PYTHONPATH=<repo>/tests/vllm_conformance PARS_CONFORMANCE_MODE=arrival \
        PARS_CHECKPOINT=<a checkpoint> python -m pytest -p pars_conformance_plugin tests/v1/core/test_scheduler.py

Nothing in vLLM's files is changed; the plugin adds:
- model shims: the tests name hub models (facebook/opt-125m, llava-hf/llava-1.5-7b-hf, ...) and there is
  no hub here. Their config.json (+ processor configs, and a tokenizer built from the packaged MiniLM one)
  go into a temp dir, and vLLM's own redirect (VLLM_MODEL_REDIRECT_PATH, read by ModelConfig) points the
  names there. Where torchvision is unusable (this CPU build), the multimodal shims are left out and the
  tests that name those models are reported as skipped, not failed.
- the substitution (PARS_CONFORMANCE_MODE): `stock` leaves vLLM's schedulers alone (checks the shims);
  `checkpoint` and `arrival` rebind the names `Scheduler` / `AsyncScheduler` inside the test modules to
  PARSScheduler / PARSAsyncScheduler, so every scheduler the tests build is a PARS one. `checkpoint`
  scores prompts with the checkpoint in PARS_CHECKPOINT; `arrival` gives every request the client score
  `request.arrival_time`, so PARS's order is vLLM's own (FCFS by arrival; (priority, arrival) under the
  priority policy) and what is tested is PARS's mechanics (queue, starvation rule, running-list sort).
  Scoring is inline (PARS_SCORING=inline): deterministic, no thread.
- a report: each test's outcome (passed/failed/error/skipped) as JSON in PARS_CONFORMANCE_REPORT, which
  the driver compares with tests/vllm_conformance/expected_failures.yaml.
- `caplog_vllm`, the one fixture of vLLM's tests/conftest.py these tests use (that conftest is not
  extracted: it imports most of vLLM's test dependencies).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

MODES = ("stock", "checkpoint", "arrival")
MODE = os.environ.get("PARS_CONFORMANCE_MODE", "stock")
if MODE not in MODES:
    raise pytest.UsageError(f"PARS_CONFORMANCE_MODE must be one of {MODES}, got {MODE!r}")

_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# The hub models the tests name: their real config.json (the scheduler reads max_model_len, the
# multimodal layout and is_encoder_decoder from it; weights are never loaded), the processor files
# multimodal models need, and the special tokens their processors look up.
_OPT = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "activation_function": "relu",
    "bos_token_id": 2,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "max_position_embeddings": 2048,
    "vocab_size": 50272,
    "torch_dtype": "float16",
}
SHIMS: dict[str, dict] = {
    "facebook/opt-125m": {
        "config.json": {
            **_OPT,
            "hidden_size": 768,
            "ffn_dim": 3072,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "word_embed_proj_dim": 768,
            "do_layer_norm_before": True,
        }
    },
    "facebook/opt-350m": {
        "config.json": {
            **_OPT,
            "hidden_size": 1024,
            "ffn_dim": 4096,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "word_embed_proj_dim": 512,
            "do_layer_norm_before": False,
        }
    },
    "llava-hf/llava-1.5-7b-hf": {
        "config.json": {
            "architectures": ["LlavaForConditionalGeneration"],
            "model_type": "llava",
            "image_token_index": 32000,
            "pad_token_id": 32001,
            "projector_hidden_act": "gelu",
            "vision_feature_layer": -2,
            "vision_feature_select_strategy": "default",
            "tie_word_embeddings": False,
            "torch_dtype": "float16",
            "vocab_size": 32064,
            "text_config": {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-05,
                "vocab_size": 32064,
                "torch_dtype": "float16",
            },
            "vision_config": {
                "model_type": "clip_vision_model",
                "hidden_size": 1024,
                "image_size": 336,
                "intermediate_size": 4096,
                "num_attention_heads": 16,
                "num_hidden_layers": 24,
                "patch_size": 14,
                "projection_dim": 768,
            },
        },
        "preprocessor_config.json": {
            "image_processor_type": "CLIPImageProcessor",
            "processor_class": "LlavaProcessor",
            "crop_size": {"height": 336, "width": 336},
            "size": {"shortest_edge": 336},
            "do_center_crop": True,
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": _CLIP_MEAN,
            "image_std": _CLIP_STD,
            "resample": 3,
            "rescale_factor": 0.00392156862745098,
        },
        "processor_config.json": {
            "processor_class": "LlavaProcessor",
            "image_token": "<image>",
            "patch_size": 14,
            "vision_feature_select_strategy": "default",
            "num_additional_image_tokens": 1,
        },
        "tokens": {"image_token_index": "<image>"},
    },
    "Qwen/Qwen2.5-VL-3B-Instruct": {
        "config.json": {
            "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "model_type": "qwen2_5_vl",
            "hidden_size": 2048,
            "intermediate_size": 11008,
            "max_position_embeddings": 128000,
            "num_attention_heads": 16,
            "num_hidden_layers": 36,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "sliding_window": 32768,
            "max_window_layers": 70,
            "use_sliding_window": False,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "vocab_size": 151936,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "image_token_id": 151655,
            "video_token_id": 151656,
            "vision_start_token_id": 151652,
            "vision_end_token_id": 151653,
            "vision_token_id": 151654,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "vision_config": {
                "depth": 32,
                "hidden_act": "silu",
                "hidden_size": 1280,
                "intermediate_size": 3420,
                "num_heads": 16,
                "in_chans": 3,
                "out_hidden_size": 2048,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "spatial_patch_size": 14,
                "window_size": 112,
                "fullatt_block_indexes": [7, 15, 23, 31],
                "tokens_per_second": 2,
                "temporal_patch_size": 2,
            },
        },
        "preprocessor_config.json": {
            "image_processor_type": "Qwen2VLImageProcessor",
            "processor_class": "Qwen2_5_VLProcessor",
            "min_pixels": 3136,
            "max_pixels": 12845056,
            "patch_size": 14,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "image_mean": _CLIP_MEAN,
            "image_std": _CLIP_STD,
        },
        "tokens": {
            "vision_start_token_id": "<|vision_start|>",
            "vision_end_token_id": "<|vision_end|>",
            "vision_token_id": "<|vision_pad|>",
            "image_token_id": "<|image_pad|>",
            "video_token_id": "<|video_pad|>",
        },
    },
}


def write_shims(root: Path, skip: list[str] = ()) -> Path:
    """Write one local model dir per hub name (but those in skip), and the redirect file vLLM reads;
    returns that file."""
    from transformers import AutoTokenizer

    from pipeline.ranking.model import resolve_encoder

    base = resolve_encoder("minilm-l6")
    redirect = {}
    for name, files in SHIMS.items():
        if name in skip:
            continue
        target = root / name.replace("/", "--")
        target.mkdir(parents=True)
        # A tokenizer (the PARS scheduler decodes prompts with it). Multimodal processors need their
        # placeholder tokens in it, and the config's placeholder ids must be the tokenizer's.
        tokenizer = AutoTokenizer.from_pretrained(base)
        config = dict(files["config.json"])
        tokens = files.get("tokens", {})
        if tokens:
            tokenizer.add_special_tokens({"additional_special_tokens": list(tokens.values())})
            config.update({key: tokenizer.convert_tokens_to_ids(token) for key, token in tokens.items()})
        tokenizer.save_pretrained(target)
        for filename, content in {**files, "config.json": config}.items():
            if filename.endswith(".json"):
                (target / filename).write_text(json.dumps(content, indent=1))
        redirect[name] = str(target)
    path = root / "model_redirect.json"
    path.write_text(json.dumps(redirect, indent=1))
    return path


# -- substitution ------------------------------------------------------------------------------------
_built = {"pars_schedulers": 0}  # proof, for the driver, that the substitution took


def _arrival_client_score(self, request):
    """`arrival` mode: every request's score is its arrival time, so PARS's order is vLLM's own."""
    return float(request.arrival_time)


def install_pars() -> None:
    """Configure the PARS scheduler for this mode (environment, score patch, a build counter)."""
    if not os.environ.get("PARS_CHECKPOINT"):
        # `arrival` never scores with it, but the scheduler refuses to start without one.
        raise pytest.UsageError(f"PARS_CONFORMANCE_MODE={MODE} needs PARS_CHECKPOINT (a PARS checkpoint dir)")
    os.environ["PARS_SCORING"] = "inline"  # deterministic: no scoring thread
    from pipeline.serving.vllm_scheduler import PARSSchedulerMixin

    if MODE == "arrival":
        PARSSchedulerMixin._pars_client_score = _arrival_client_score
    init = PARSSchedulerMixin.__init__

    def counting_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _built["pars_schedulers"] += 1

    PARSSchedulerMixin.__init__ = counting_init


def substitute() -> None:
    """Rebind Scheduler/AsyncScheduler in every loaded vLLM test module to the PARS classes.

    Idempotent; run after collection and again before each test, for modules a test imports late."""
    if MODE == "stock":
        return
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from pipeline.serving.vllm_scheduler import PARSAsyncScheduler, PARSScheduler

    swaps = {"Scheduler": (Scheduler, PARSScheduler), "AsyncScheduler": (AsyncScheduler, PARSAsyncScheduler)}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "tests" or name.startswith("tests.")):
            continue
        for attr, (stock, pars) in swaps.items():
            if getattr(module, attr, None) is stock:
                setattr(module, attr, pars)


def _torchvision_usable() -> bool:
    """vLLM's llava and Qwen2.5-VL processors import torchvision (see torchvision_fix)."""
    from torchvision_fix import import_torchvision

    return import_torchvision()


# -- pytest hooks ------------------------------------------------------------------------------------
_outcomes: dict[str, str] = {}
_shim_root: Path | None = None
_unavailable: list[str] = []  # shim models left out (their tests are reported as skipped)
UNAVAILABLE_REASON = (
    "needs torchvision (vLLM's processor for {name} imports it; none found: run scripts/fetch_vllm_tests.py)"
)


def pytest_configure(config: pytest.Config) -> None:
    global _shim_root
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub: a name without a shim fails at once
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if not _torchvision_usable():
        _unavailable.extend(name for name, files in SHIMS.items() if "preprocessor_config.json" in files)
    _shim_root = Path(tempfile.mkdtemp(prefix="pars-vllm-shims-"))
    os.environ["VLLM_MODEL_REDIRECT_PATH"] = str(write_shims(_shim_root, skip=_unavailable))
    if MODE != "stock":
        install_pars()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _shim_root is not None:
        shutil.rmtree(_shim_root, ignore_errors=True)
    report = os.environ.get("PARS_CONFORMANCE_REPORT")
    if report:
        Path(report).write_text(
            json.dumps(
                {"mode": MODE, "outcomes": _outcomes, "unavailable_models": _unavailable, **_built},
                indent=1,
                sort_keys=True,
            )
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    substitute()


@pytest.fixture(autouse=True)
def _pars_substitute():
    substitute()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails only because it names a model left out above is reported as skipped."""
    report = yield
    if report.failed and _unavailable and call.excinfo is not None:
        text = str(call.excinfo.value)
        for name in _unavailable:
            if f"specified: '{name}'" in text:  # ModelConfig's error for a name it cannot resolve
                report.outcome = "skipped"
                report.longrepr = (
                    str(item.path),
                    item.location[1] or 0,
                    "Skipped: " + UNAVAILABLE_REASON.format(name=name),
                )
                break
    return report


def pytest_collectreport(report) -> None:
    if report.failed:  # a module that does not even import
        _outcomes[report.nodeid] = "error"


def pytest_runtest_logreport(report) -> None:
    # One outcome per test: a failure in any phase wins; a skip is recorded from the phase that skipped.
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped and report.nodeid not in _outcomes:
        _outcomes[report.nodeid] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.when == "call" and report.nodeid not in _outcomes:
        _outcomes[report.nodeid] = "xpassed" if hasattr(report, "wasxfail") else "passed"


# -- the one fixture of vLLM's tests/conftest.py these tests use (copied from vLLM 0.32.0) -------------
@pytest.fixture()
def caplog_vllm(caplog):
    logger = logging.getLogger("vllm")
    previous = logger.propagate
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO):
            yield caplog
    finally:
        logger.propagate = previous
