"""How long does PARS hold up vLLM's scheduler? 2,000 real prompts arrive at once.

vLLM's real v1 `PARSScheduler` runs on the CPU harness (`pipeline.serving.cpu_harness`): a stand-in
model directory with the served model's tokenizer (SmolLM2's, chat template included) and a fake
engine that answers each step after `--step-ms` (a GPU decode step's order of magnitude). The
prompts are ShareGPT test prompts, chat-templated and tokenized as the server would; the ranker is the
exported checkpoint. Every `schedule()` call's time inside PARS code (taking finished scores, keying
arrivals, re-sorting `running`) is recorded, for both scoring modes:

  background  the default: a worker thread scores while the engine steps; schedule() never waits
  inline      the previous behaviour: all arrivals scored in one batch at the next schedule()

-> metrics/scheduler_overhead.json: arrivals, max/mean PARS seconds per schedule(), the steps and
seconds until every request had a score (the default mode at top level; `inline` beside it).

    python benchmarks/scheduler_overhead.py [--arrivals 2000] [--step-ms 20]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arrivals", type=int, default=2000)
    p.add_argument("--checkpoint", default="models/export/pars-recorded")
    p.add_argument("--served-model", default="models/base/smollm2", help="its tokenizer and chat template")
    p.add_argument("--prompts", default="data/prompts/prompts.parquet")
    p.add_argument("--dataset", default="sharegpt")
    p.add_argument("--split", default="test")
    p.add_argument("--step-ms", type=float, default=20.0, help="fake engine step time")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--torch-threads", type=int, default=1, help="the scorer's torch threads")
    p.add_argument("--modes", default="background,inline")
    p.add_argument("--out-json", default="metrics/scheduler_overhead.json")
    args = p.parse_args(argv)
    if args.arrivals < 1 or args.step_ms < 0 or args.max_num_seqs < 1 or args.torch_threads < 1:
        p.error("--arrivals, --max-num-seqs and --torch-threads must be >= 1, --step-ms >= 0")
    # before thousands of prompts are tokenized (a missing --served-model would be read as a hub id)
    if not Path(args.prompts).is_file():
        raise FileNotFoundError(f"--prompts {args.prompts}: no such file (dvc repro prepare)")
    for flag, path, stage in (
        ("--served-model", args.served_model, "materialize"),
        ("--checkpoint", args.checkpoint, "export"),
    ):
        if not Path(path).is_dir():
            raise FileNotFoundError(f"{flag} {path}: no such directory (dvc repro {stage})")
    return args


def load_prompt_ids(args) -> list[list[int]]:
    from transformers import AutoTokenizer

    prompts = pd.read_parquet(args.prompts)
    texts = prompts[(prompts["dataset"] == args.dataset) & (prompts["split"] == args.split)]
    texts = texts.sort_values("prompt_id")["prompt"].tolist()
    if len(texts) < args.arrivals:
        raise SystemExit(
            f"{args.prompts}: only {len(texts)} {args.dataset}/{args.split} prompts, " f"--arrivals {args.arrivals}"
        )
    tokenizer = AutoTokenizer.from_pretrained(args.served_model)
    # as the server would: the chat template rendered, then tokenized (prompts cut to 3,000 tokens)
    rendered = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        for t in texts[: args.arrivals]
    ]
    return [ids[:3000] for ids in tokenizer(rendered, add_special_tokens=False)["input_ids"]]


def run_mode(mode: str, args, model_cfg, prompt_ids: list[list[int]]) -> dict:
    from pipeline.serving.cpu_harness import FakeEngine, build_scheduler
    from pipeline.serving.vllm_scheduler import PARSScheduler

    sched = build_scheduler(
        PARSScheduler,
        model_cfg,
        max_num_seqs=args.max_num_seqs,
        num_blocks=40_000,
        max_num_batched_tokens=8192,
        pars={"checkpoint": args.checkpoint, "scoring": mode},
    )
    engine = FakeEngine(sched, step_clock=False)  # the queue keeps its wall clock
    now = time.time()
    for i, ids in enumerate(prompt_ids):
        engine.add(f"r{i}", 0, out_len=64, prompt_ids=ids, arrival=now)
    per_call, steps, start = [], 0, time.perf_counter()
    while True:
        engine.step()
        steps += 1
        per_call.append(sched.pars_stats["last_overhead_s"])
        stats = sched.pars_stats  # every arrival scored, left provisional, or finished before its score
        keyed = stats["num_scored"] + stats["num_fallback"] + stats["num_finished_unscored"]
        if keyed >= len(prompt_ids):
            break
        time.sleep(args.step_ms / 1000)
    seconds = time.perf_counter() - start
    sched.shutdown()
    per_call = np.asarray(per_call)
    return {
        "scoring": mode,
        "arrivals": len(prompt_ids),
        "max_pars_s_per_schedule": float(per_call.max()),
        "mean_pars_s_per_schedule": float(per_call.mean()),
        "p99_pars_s_per_schedule": float(np.quantile(per_call, 0.99)),
        "steps_until_all_scored": steps,
        "seconds_until_all_scored": round(seconds, 3),
        "num_scored": sched.pars_stats["num_scored"],
        "num_faults": sched.pars_stats["num_faults"],
        "num_finished_unscored": sched.pars_stats["num_finished_unscored"],
        "finished_requests": len(engine.finished),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from pipeline.hardware import machine
    from pipeline.serving import cpu_harness

    torch.set_num_threads(args.torch_threads)
    prompt_ids = load_prompt_ids(args)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_cfg = cpu_harness.model_config(
            cpu_harness.model_dir(Path(tmp) / "served", tokenizer_dir=Path(args.served_model))
        )
        for mode in args.modes.split(","):
            results[mode] = run_mode(mode, args, model_cfg, prompt_ids)
            r = results[mode]
            print(
                f"{mode:>10}: max {1000 * r['max_pars_s_per_schedule']:8.1f} ms, mean "
                f"{1000 * r['mean_pars_s_per_schedule']:7.2f} ms per schedule(); all "
                f"{r['arrivals']} scored after {r['steps_until_all_scored']} steps, "
                f"{r['seconds_until_all_scored']:.1f} s",
                flush=True,
            )
    default = results.get("background") or next(iter(results.values()))
    out = {
        **default,
        "checkpoint": args.checkpoint,
        "served_model_tokenizer": args.served_model,
        "prompts": f"{args.dataset}/{args.split}",
        "step_ms": args.step_ms,
        "max_num_seqs": args.max_num_seqs,
        "torch_threads": args.torch_threads,
        "machine": machine(),
        "modes": results,
    }
    Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"-> {args.out_json}")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
