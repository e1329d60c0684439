"""report: the results page, metrics/report.md, generated from the metrics files so it cannot go stale.

A short summary (what τ_b is, the served predictor, the headline figures against the project's
targets, met or not), the paper-style tau_b tables from metrics/ranking.json
(pipeline.ranking.report_tables), then the serving results: the engine settings the page uses,
simulator workloads, the real-engine burst, the scheduler stall, simulator fidelity, capacity, and
what a cold `dvc repro` and training cost, each from its own metrics file when it exists and each
rendered by pipeline.serving.results. Image links are relative to metrics/report.md."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from pipeline.contracts import nested_value, read_json, same_file
from pipeline.errors import PARSError
from pipeline.ranking.report_tables import OVERALL, join_names, render_markdown
from pipeline.serving.results import (
    capacity_section,
    cold_repro_section,
    draws_lines,
    engine_labels,
    engine_section,
    engines_section,
    fidelity_section,
    fmt_ms,
    fmt_num,
    image_lines,
    is_finite_number,
    overhead_section,
    simulation_section,
    train_throughput_section,
)

REPORT = "metrics/report.md"  # the report stage's output
RESULT_FILES = {
    "simulation": "metrics/simulation.json",
    "engine_bench": "metrics/engine_bench.json",
    "scheduler_overhead": "metrics/scheduler_overhead.json",
    "sim_fidelity": "metrics/sim_fidelity.json",
    "capacity": "metrics/capacity.json",
    "cold_repro": "metrics/cold_repro.json",
    "train_throughput": "metrics/train_throughput.json",
}
# draws of the engine burst's FCFS/PARS ratio (benchmarks/engine_draws.py): the engine table's spread line
ENGINE_DRAWS = "metrics/choices/engine_draws.json"
# a cross-model predictor's training metrics (train_cross writes them): its `members`
CROSS_TRAIN = "metrics/train/{model}-pairwise.json"
# noise ceilings of models with one recorded answer per prompt, estimated by a benchmark
ESTIMATED_CEILINGS = ("metrics/choices/chatgpt_noise_ceiling.json",)
# what a damaged metrics file raises deep in the renderers (a missing key, a list for a mapping)
DAMAGED = (KeyError, IndexError, TypeError, AttributeError, ValueError, ZeroDivisionError)
PAGE_DIR = str(Path(REPORT).parent)  # image links are relative to the report stage's page
PLOTS = {
    "tau_b": "plots/evaluate/tau_b.png",
    "transfer": "plots/evaluate/transfer.png",
    "engine_bench": "plots/engine_bench.png",
    "sim_fidelity": "plots/sim_fidelity.png",
}
SPEEDUP_VS_TAU = "plots/simulation/{workload}_speedup_vs_tau.png"

# The project's acceptance targets (the issue's, not measurements): the summary says which the
# metrics meet. Models by their key in metrics/ranking.json and metrics/simulation.json.
TAU_TARGETS = {"chatgpt": 0.45, "gpt-4-turbo": 0.45}  # test pairwise τ_b, overall, per-model predictor
EXPORT_TAU = 0.35  # the served export's τ_b on each model it was trained on
SIM_WORKLOAD = "chatgpt"  # simulator burst: PARS over FCFS, mean and p90 per-token latency; PARS / oracle
SIM_MEAN, SIM_P90, SIM_ORACLE = 3.0, 2.0, 1.5
ENGINE_RATIO = 2.0  # engine benchmark FCFS / PARS mean per-token latency
OVERHEAD_SHARE = 0.005  # PARS code in schedule(), share of the engine run's wall time
SCHEDULE_S = 0.050  # at most this long in PARS code per schedule() call (scheduler stall, its default mode)


def _render(render, path: str | Path, *args):
    """render(*args), or one line naming the metrics file that is not as its stage writes it."""
    try:
        return render(*args)
    except DAMAGED as exc:  # chained: `pars --debug report` shows where it broke (a damaged file, or a bug)
        raise PARSError(
            f"{path}: not as its stage writes it ({type(exc).__name__}: {exc}); rerun that stage "
            f"(or, if it is current, `pars --debug report` shows the traceback)"
        ) from exc


def _plot(path: str) -> str:
    """A link to the plot the stage (or benchmark) that writes a section's metrics writes beside them,
    relative to the report stage's page. Not checked on disk: the page depends on its declared deps only."""
    return Path(os.path.relpath(path, PAGE_DIR)).as_posix()


# ---------------------------------------------------------------- what the page knows of the predictors


def served_checkpoint(bench: dict | None) -> dict | None:
    """The serving checkpoint as the engine benchmark recorded it (setup.checkpoint and its pars.json
    `trained_on`): {model, method, checkpoint, members, source}; None without one."""
    setup = nested_value(bench, "setup") or {}
    trained_on = setup.get("checkpoint_trained_on")
    if not setup.get("checkpoint") or not isinstance(trained_on, dict) or not trained_on.get("model"):
        return None
    return {
        "model": trained_on["model"],
        "method": setup.get("checkpoint_method", "pairwise"),
        "checkpoint": setup["checkpoint"],
        "members": list(trained_on["members"]) if isinstance(trained_on.get("members"), list) else None,
        "source": RESULT_FILES["engine_bench"],
    }


def cross_model_members(ranking: dict, served: dict | None) -> dict[str, list[str] | None]:
    """Each cross-model predictor's member models (None: not recorded), from its training metrics,
    else from the served checkpoint's metadata when that is the same predictor."""
    members = {}
    for model in ranking["predictors"]:
        if model in ranking["references"]:
            continue  # a per-model predictor
        path = CROSS_TRAIN.format(model=model)
        found = None
        if Path(path).is_file():
            found = read_json(path).get("members")  # read_json refuses anything but an object
        if not found and served and served["model"] == model:
            found = served.get("members")
        members[model] = list(found) if isinstance(found, list) and found else None
    return members


# ---------------------------------------------------------------- the summary


def _overall_tau(ranking: dict, model: str, method: str, eval_model: str) -> float | None:
    tau = nested_value(ranking, "predictors", model, method, eval_model, OVERALL, "kendall_tau_b")
    return tau if is_finite_number(tau) else None


def summary_lines(
    ranking: dict, serving: dict[str, Any], members: dict, served: dict | None, draws: dict | None = None
) -> list[str]:
    """What τ_b is, the served predictor, and the headline figures against the project's targets."""
    # (met, or None where not measured; what is measured; its value as written; the target)
    checks: list[tuple[bool | None, str, str, str]] = []

    def check(value: Any, ok, what: str, written: str, target: str) -> None:
        checks.append((ok(value) if is_finite_number(value) else None, what, written, target))

    for model, target in TAU_TARGETS.items():
        tau = _overall_tau(ranking, model, "pairwise", model)
        written = fmt_num(tau)
        # a blend of this predictor (the blend stage's pairwise+<features>) is shown beside it, not in its place
        blends = [m for m in nested_value(ranking, "predictors", model) or {} if m.startswith("pairwise+")]
        shown = [f"`{model}/{m}` {fmt_num(_overall_tau(ranking, model, m, model))}" for m in blends]
        if shown:
            written += f" (blended: {', '.join(shown)})"
        check(tau, lambda t, g=target: t >= g, f"{model} test pairwise τ_b", written, f"≥ {target:g}")
    exported = (served or {}).get("members") or []
    taus = {m: _overall_tau(ranking, served["model"], served["method"], m) for m in exported}
    beats = [
        nested_value(ranking, "predictors", served["model"], served["method"], m, OVERALL, "beats_tfidf_ridge")
        for m in exported
    ]
    check(
        min(taus.values()) if taus and None not in taus.values() else None,
        lambda t: t >= EXPORT_TAU,
        "the export's τ_b on each model it was trained on",
        ": " + ", ".join(f"{m} {fmt_num(t)}" for m, t in taus.items()),
        f"≥ {EXPORT_TAU:g} on each"
        + (f"; above TF-IDF + ridge, paired interval above 0, on {beats.count(True)} of {len(beats)}" if beats else ""),
    )
    w = nested_value(serving.get("simulation"), "workloads", SIM_WORKLOAD) or {}
    burst = next((v for k, v in (w.get("scenarios") or {}).items() if k.startswith("burst_")), {})
    pars = burst.get("pars") or {}
    mean, p90, ratio = pars.get("speedup_mean_over_fcfs"), pars.get("speedup_p90_over_fcfs"), None
    if is_finite_number(pars.get("gap_mean_to_oracle")):  # simulate's PARS / oracle - 1
        ratio = 1 + pars["gap_mean_to_oracle"]
    where = f"simulated {SIM_WORKLOAD} burst"
    check(
        mean,
        lambda x: x >= SIM_MEAN,
        f"{where}, FCFS / PARS mean per-token latency",
        f"{fmt_num(mean, '.2f')}×",
        f"≥ {SIM_MEAN:g}×",
    )
    check(p90, lambda x: x >= SIM_P90, f"{where}, FCFS / PARS p90", f"{fmt_num(p90, '.2f')}×", f"≥ {SIM_P90:g}×")
    check(
        ratio,
        lambda x: x <= SIM_ORACLE,
        f"{where}, PARS / oracle mean per-token latency",
        f"{fmt_num(ratio, '.2f')}×",
        f"≤ {SIM_ORACLE:g}×",
    )
    bench = serving.get("engine_bench") or {}
    f_mean, p_mean = (
        nested_value(bench, "fcfs", "mean_per_token_latency"),
        nested_value(bench, "pars", "mean_per_token_latency"),
    )
    engine = f_mean / p_mean if is_finite_number(f_mean) and is_finite_number(p_mean) and p_mean > 0 else None
    size = str(nested_value(bench, "setup", "num_prompts"))  # the draws of the benchmark's own burst size
    spread = nested_value(draws, "sizes", size, "fcfs_over_pars")
    check(
        engine,
        lambda x: x >= ENGINE_RATIO,
        "engine benchmark (one burst), FCFS / PARS mean per-token latency",
        f"{fmt_num(engine, '.2f')}×",
        f"≥ {ENGINE_RATIO:g}×"
        + (
            f"; one draw: over {len(nested_value(draws, 'sizes', size, 'draws') or [])} simulated draws of {size} "
            f"requests the geometric mean is {fmt_num(spread.get('geometric_mean'), '.2f')}×, "
            f"{fmt_num(100 * (1 - spread['share_at_least_2x']), '.0f')} % of them below 2×"
            if isinstance(spread, dict) and is_finite_number(spread.get("share_at_least_2x"))
            else ""
        ),
    )
    share, scoring = nested_value(bench, "pars", "overhead_fraction"), nested_value(bench, "pars", "scoring_fraction")
    check(
        share,
        lambda x: x <= OVERHEAD_SHARE,
        "PARS code in schedule(), share of the engine run's wall time",
        f"{fmt_num(100 * share, '.3f')} %" if is_finite_number(share) else "–",
        f"≤ {100 * OVERHEAD_SHARE:g} %"
        + (
            f"; the scoring thread's {fmt_num(100 * scoring, '.1f')} % is not in it"
            if is_finite_number(scoring)
            else ""
        ),
    )
    over = serving.get("scheduler_overhead") or {}
    worst = over.get("max_pars_s_per_schedule")
    others = [  # (scoring mode, its longest schedule() call) of the modes other than the measured one
        (mode, fmt_ms(r.get("max_pars_s_per_schedule")))
        for mode, r in (over.get("modes") or {}).items()
        if mode != over.get("scoring") and isinstance(r, dict)
    ]
    check(
        worst,
        lambda x: x <= SCHEDULE_S,
        "longest PARS time in one schedule() call"
        + (f" ({over.get('arrivals')} arrivals at once, {over.get('scoring')} scoring)" if over else ""),
        f"{fmt_ms(worst)} ms",
        f"≤ {1000 * SCHEDULE_S:g} ms",
    )
    said = [
        (ok, what + ("" if written.startswith(":") else " ") + f"{written} (target {target})")
        for ok, what, written, target in checks
    ]
    met = [text for ok, text in said if ok]
    missed = [text for ok, text in said if ok is False]
    unknown = [f"{what} (target {target})" for ok, what, _, target in checks if ok is None]
    lines = [
        "# PARS results",
        "",
        "Generated by `pars report` from the committed metrics files; every measured figure on this page is read "
        "from them (the targets are the project's, written in `pipeline/report.py`), and each section names its "
        "file and the command that reproduces it.",
        "",
        "- **τ_b** is Kendall's rank correlation between a predictor's scores and the prompts' true answer lengths "
        "on the test split: 1 = the same order, 0 = no relation; PARS serves the waiting queue shortest predicted "
        "answer first, so a higher τ_b means an order closer to shortest-job-first.",
    ]
    if served:
        kind = "cross-model " if served["model"] in members else ""
        who = f"the {kind}{served['method']} predictor `{served['model']}`"
        if served.get("members"):
            who += f", trained on {join_names(served['members'])}"
        line = f"- **Served by default**: `{served['checkpoint']}`, {who} (as `{served['source']}` records it)"
        by = (w.get("score_model") or {}).get("pars")
        if by and by != served["model"]:
            named = f"`{by}`" if "/" in by else f"`{by}`'s own predictor"  # <train model>/<method>, or a train model
            line += f"; the simulated {SIM_WORKLOAD} workload below scores PARS with {named} instead"
        lines.append(line + ".")
    n = len(checks)
    lines.append(f"- **Targets met ({len(met)} of {n})**: " + ("; ".join(met) if met else "none") + ".")
    lines.append(f"- **Not met ({len(missed)} of {n})**: " + ("; ".join(missed) if missed else "none") + ".")
    if unknown:
        lines.append(
            f"- **Not measured ({len(unknown)} of {n})**, no metrics file or figure: " + "; ".join(unknown) + "."
        )
    for mode, held in others:  # beside the target, not in it: how long another scoring mode holds the engine
        lines.append(f"- With `scoring: {mode}` instead, the longest schedule() call holds the engine {held} ms.")
    return lines + [""]


# ---------------------------------------------------------------- the page


def render_page(
    ranking: dict,
    ceilings: list[dict],
    serving: dict[str, Any] | None,
    draws: dict | None,
    members: dict,
    served: dict | None,
    ranking_path: str | Path,
) -> str:
    """The page: the summary (with serving) and ranking tables, then the serving sections. Each part is
    rendered on its own so that a damaged file is named; the summary last, from files already checked."""
    plots = {k: _plot(PLOTS[k]) for k in ("tau_b", "transfer")}
    tables = _render(
        lambda: render_markdown(ranking, ceilings, cross_members=members, served=served, plots=plots), ranking_path
    )
    if serving is None:
        return tables
    labels = _render(engine_labels, "the serving metrics files", serving)
    parts: list[str] = []
    builders = {
        "simulation": lambda d: simulation_section(
            d,
            labels["simulation"],
            members,
            served,
            {name: _plot(SPEEDUP_VS_TAU.format(workload=name)) for name in d.get("workloads", {})},
        ),
        "engine_bench": lambda d: engine_section(d, labels["engine_bench"]),
        "scheduler_overhead": lambda d: overhead_section(d, labels["scheduler_overhead"], SCHEDULE_S),
        "sim_fidelity": lambda d: fidelity_section(d, labels["engine_bench"], _plot(PLOTS["sim_fidelity"])),
        "capacity": lambda d: capacity_section(d, labels, serving),
        "cold_repro": cold_repro_section,
        "train_throughput": train_throughput_section,
    }
    parts += _render(engines_section, "the serving metrics files", serving, labels)
    for key, build in builders.items():
        data = serving.get(key)
        if data is None:
            parts += [f"*(no `{RESULT_FILES[key]}` yet: its section is left out)*", ""]
            continue
        section = _render(build, RESULT_FILES[key], data)
        if key == "engine_bench":
            if draws is not None:
                section += _render(draws_lines, ENGINE_DRAWS, draws, serving.get("sim_fidelity"), ENGINE_DRAWS)
            section += image_lines(
                _plot(PLOTS["engine_bench"]), "Engine benchmark: latency, TTFT and throughput by policy"
            )
        parts += section
    summary = _render(summary_lines, "the metrics files", ranking, serving, members, served, draws)
    return "\n".join(summary) + "\n" + tables.rstrip() + "\n\n" + "\n".join(parts).rstrip() + "\n"


TAU_KEYS = ("kendall_tau_b", "ci_low", "ci_high")  # of predictors and references (a difference may reach 2)


def out_of_range_tau(node, where: str = ""):
    """(dotted key, value) of every tau_b or interval end in evaluate's metrics that is a number
    outside [-1, 1] (null and NaN are undefined, as evaluate writes them)."""
    if isinstance(node, dict):
        for key, value in node.items():
            at = f"{where}.{key}" if where else str(key)
            if key in TAU_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                if not (value != value or -1 <= value <= 1):
                    yield at, value
            else:
                yield from out_of_range_tau(value, at)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars report", description=__doc__.split("\n")[0])
    parser.add_argument("--ranking", default="metrics/ranking.json", help="evaluate's metrics (default: %(default)s)")
    parser.add_argument(
        "--out",
        help=f"markdown file to write (default: {REPORT}; with --ranking-only, none: printed only); "
        f"its image links are relative to {REPORT}",
    )
    parser.add_argument("--ranking-only", action="store_true", help="leave out the serving sections")
    args = parser.parse_args(argv)
    from pipeline.contracts import ensure_parent, write_text

    # a ranking-only page must not replace the report stage's full page unless asked to
    out = args.out
    if out is None and not args.ranking_only:
        out = REPORT
    path = Path(args.ranking)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (run `pars evaluate` or `dvc repro evaluate` first)")

    def refuse_inputs(files) -> None:
        # the page written over a metrics file it reads (or would read, once its stage runs) loses it
        for what, f in files:
            if out is not None and same_file(out, f):
                raise PARSError(f"--out {out}: is {what} {f}; the page would replace it")

    refuse_inputs(
        [("the --ranking file", path)]
        + [("the input", f) for f in (*ESTIMATED_CEILINGS, *RESULT_FILES.values(), ENGINE_DRAWS)]
    )
    if out is not None:
        # a file in the way: one line, before any work; the directory is made only when the page is written
        ensure_parent(out, create=False)
    # every file read (and its JSON checked) before anything is rendered
    ranking = read_json(path)
    ceiling_files = [f for f in ESTIMATED_CEILINGS if Path(f).is_file()]
    ceilings = [read_json(f) for f in ceiling_files]
    serving, draws = None, None
    if not args.ranking_only:
        serving = {key: read_json(f) if Path(f).is_file() else None for key, f in RESULT_FILES.items()}
        draws = read_json(ENGINE_DRAWS) if Path(ENGINE_DRAWS).is_file() else None
    for key in ("predictors", "references"):
        if not isinstance(ranking.get(key), dict):
            problem = "has no" if key not in ranking else "has a non-mapping"
            raise PARSError(f"{path}: {problem} {key!r} (evaluate writes it; rerun `pars evaluate`)")
    bad = next(out_of_range_tau({k: ranking[k] for k in ("predictors", "references")}), None)
    if bad is not None:  # a damaged file: shown, it would be a silent wrong number
        raise PARSError(f"{path}: {bad[0]} {bad[1]!r} is not a tau_b (between -1 and 1; rerun `pars evaluate`)")
    for f, ceiling in zip(ceiling_files, ceilings):
        # every key the tables read, so a missing one is named here, not blamed on the ranking file
        missing = [k for k in ("model", "dataset", "noise_ceiling", "what", "command") if k not in ceiling]
        stat = ceiling.get("noise_ceiling")
        missing += [
            f"noise_ceiling.{k}"
            for k in ("kendall_tau_b", "ci_low", "ci_high", "n_prompts")
            if not isinstance(stat, dict) or k not in stat
        ]
        if missing:
            raise PARSError(f"{f}: has no {missing[0]!r} (rerun the benchmark that writes it)")
    # the served checkpoint (the engine benchmark's record of it) names the cross-model row it is
    bench = serving.get("engine_bench") if serving else None
    if bench is None and Path(RESULT_FILES["engine_bench"]).is_file():
        bench = read_json(RESULT_FILES["engine_bench"])
    served = _render(served_checkpoint, RESULT_FILES["engine_bench"], bench)
    cross = [CROSS_TRAIN.format(model=m) for m in ranking["predictors"] if m not in ranking["references"]]
    refuse_inputs([("the input", f) for f in cross])
    members = cross_model_members(ranking, served)
    text = render_page(ranking, ceilings, serving, draws, members, served, path)
    if out is not None:
        write_text(text, out)
    print(text, end="")
    return 0
