"""`pars report`: where the page goes, an estimated noise ceiling checked for every key the tables read, and
what the page says: the summary against the targets, the cross-model row, the serving sections' own figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import one_line_error, run_cli

RANKING = '{"predictors": {}, "references": {}}'
CEILING = Path("metrics/choices/chatgpt_noise_ceiling.json")
GOOD_CEILING = {
    "model": "chatgpt",
    "dataset": "sharegpt",
    "what": "two replies of repeated prompts",
    "command": "python benchmarks/chatgpt_noise_ceiling.py",
    "noise_ceiling": {"kendall_tau_b": 0.6, "ci_low": 0.5, "ci_high": 0.7, "n_prompts": 100},
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ranking.json").write_text(RANKING)
    return tmp_path


def test_ranking_only_prints_and_leaves_the_stage_output_alone(capsys, workdir):
    rc, out, _ = run_cli(capsys, "report", "--ranking", "ranking.json", "--ranking-only")
    assert rc == 0 and out and "## Capacity" not in out
    assert not (workdir / "metrics").exists()  # metrics/report.md is the report stage's, with serving sections
    rc, out, _ = run_cli(capsys, "report", "--ranking", "ranking.json", "--ranking-only", "--out", "page.md")
    assert rc == 0 and (workdir / "page.md").read_text() == out  # written where asked
    rc, out, _ = run_cli(capsys, "report", "--ranking", "ranking.json")
    assert rc == 0 and (workdir / "metrics/report.md").read_text() == out  # the full page: the stage's file


@pytest.mark.parametrize(
    "drop, named",
    [("command", "'command'"), ("what", "'what'"), ("noise_ceiling.n_prompts", "'noise_ceiling.n_prompts'")],
)
def test_estimated_ceiling_missing_key_is_named(capsys, workdir, drop, named):
    ceiling = json.loads(json.dumps(GOOD_CEILING))
    *parents, key = drop.split(".")
    node = ceiling
    for name in parents:
        node = node[name]
    del node[key]
    (workdir / CEILING).parent.mkdir(parents=True)
    (workdir / CEILING).write_text(json.dumps(ceiling))
    rc, _, err = run_cli(capsys, "report", "--ranking", "ranking.json", "--ranking-only")
    assert f"has no {named}" in one_line_error(rc, err, "report", CEILING)
    (workdir / CEILING).write_text(json.dumps(GOOD_CEILING))
    assert run_cli(capsys, "report", "--ranking", "ranking.json", "--ranking-only")[0] == 0


# ---------------------------------------------------------------- the page, from small metrics files


def _stat(tau, beats=True):
    return {
        "kendall_tau_b": tau,
        "ci_low": tau - 0.05,
        "ci_high": tau + 0.05,
        "n_prompts": 100,
        "beats_prompt_length": beats,
        "beats_tfidf_ridge": beats,
    }


def _ranking(taus: dict) -> dict:
    """taus: {(train model, eval model): tau_b} of pairwise predictors; one dataset per eval model."""
    datasets = {"chatgpt": "sharegpt", "gpt-4-turbo": "alpaca_eval", "smollm2": "arena_hard"}
    ref = {"n_prompts": 100, "prompt_length": _stat(0.1), "noise_ceiling": None}
    predictors: dict = {}
    for (model, eval_model), tau in taus.items():
        group = {"overall": _stat(tau), datasets[eval_model]: _stat(tau)}
        predictors.setdefault(model, {}).setdefault("pairwise", {})[eval_model] = group
    return {
        "predictors": predictors,
        "references": {m: {"overall": ref, ds: ref} for m, ds in datasets.items()},
    }


def _row(mean, p90, ttft, speedup=1.0, p90_speedup=1.0, gap=None):
    row = {
        "mean_per_token_latency": mean,
        "p90_per_token_latency": p90,
        "p90_ttft": ttft,
        "speedup_mean_over_fcfs": speedup,
        "speedup_p90_over_fcfs": p90_speedup,
        "requests": 500,
    }
    return row if gap is None else {**row, "gap_mean_to_oracle": gap}  # as simulate writes it: PARS / oracle - 1


SIM = {
    "engine": {"M": 131000, "chunk": 512, "max_num_seqs": 256, "step_c0": 0.04, "step_c1": 0.0},
    "workloads": {
        "chatgpt": {
            "requests": "500 test prompts",
            "score_model": {"pars": "chatgpt", "pointwise": "chatgpt"},
            "scenarios": {
                "burst_500": {
                    "fcfs": _row(0.9, 1.2, 50.0),
                    "pars": _row(0.25, 0.5, 40.0, 3.6, 2.4, gap=0.25),
                    "oracle": _row(0.2, 0.3, 30.0, 4.5, 4.0, gap=0.0),
                },
                "poisson_0.8": {"fcfs": _row(0.1, 0.2, 0.1), "pars": _row(0.1, 0.2, 0.1, 1.0, 1.0)},
                "poisson_1.25": {"fcfs": _row(0.3, 0.5, 18.9), "pars": _row(0.1, 0.2, 23.6, 2.6, 2.25)},
            },
        },
        "smollm2": {
            "requests": "50 test prompts resampled",
            "score_model": {"pars": "recorded", "pointwise": "smollm2", "listwise": "smollm2"},
            "scenarios": {"burst_500": {"fcfs": _row(0.3, 0.7, 40.0)}},
        },
    },
}
TRAINED_ON = {"model": "recorded", "members": ["chatgpt", "gpt-4-turbo"]}
BENCH = {
    "fcfs": {**_row(4.0, 6.0, 70.0), "mean_ttft": 70.0, "throughput_rps": 1.2, "engine": {"M": 23168}},
    "pars": {
        **_row(1.6, 3.0, 60.0),
        "mean_ttft": 60.0,
        "throughput_rps": 1.2,
        "overhead_fraction": 0.0001,
        "scoring_fraction": 0.025,
        "max_overhead_s_per_schedule": 0.001,
    },
    "setup": {
        "checkpoint": "models/export/pars-recorded",
        "checkpoint_method": "pairwise",
        "checkpoint_trained_on": TRAINED_ON,
    },
}
STALL = {
    "scoring": "background",
    "arrivals": 2000,
    "step_ms": 20.0,
    "max_pars_s_per_schedule": 0.0076,
    "modes": {
        "background": {
            "max_pars_s_per_schedule": 0.0076,
            "mean_pars_s_per_schedule": 5e-05,
            "p99_pars_s_per_schedule": 0.00028,
            "steps_until_all_scored": 993,
            "seconds_until_all_scored": 21.658,
        },
        "inline": {
            "max_pars_s_per_schedule": 18.4015,
            "mean_pars_s_per_schedule": 18.4015,
            "steps_until_all_scored": 1,
            "seconds_until_all_scored": 18.403,
        },
    },
}
DRAWS = {
    "command": "python benchmarks/engine_draws.py",
    "split": "val",
    "step_model": {"c0_s": 0.0317, "c1_s_per_token": 0.001344},
    "sizes": {
        "200": {
            "fcfs_over_pars": {"geometric_mean": 1.99, "min": 1.35, "max": 2.99, "share_at_least_2x": 0.4667},
            "draws": [{}, {}, {}],
        }
    },
}
FIDELITY = {"step_model": {"c0_s": 0.0556, "c1_s_per_token": 0.001077}}
COLD = {
    "commit": "de184fc08aa01fa90c9a8d2b35cb47d1585f449e",
    "machine": "Xeon",
    "total_s": 2124.0,
    # train@tiny is the shortest stage: listed anyway, as every train stage is
    "stages_s": {**{f"stage{i}": 100.0 + i for i in range(9)}, "train@tiny": 1.0},
    "skipped": ["lengths", "capacity"],
    "previous": {"commit": "a880334f", "machine": "EPYC", "total_s": 3492.0, "stages_s": {"train@tiny": 2.0}},
}
SPEED = {
    "command": "python benchmarks/train_throughput.py --steps 60",
    "machine": "Xeon",
    "before_after": "full (every layer trained) against fast+pad (the default train section)",
    "args": {"model": "chatgpt", "steps": 60, "repeats": 2, "max_train_prompts": 3000, "batch_size": 32},
    "results": [
        {"config": "full", "precision": "32-true", "frozen_layers": 0, "prompts_per_s": 20.0, "val_tau_b": 0.28},
        {"config": "fast", "precision": "bf16-mixed", "frozen_layers": 3, "prompts_per_s": 100.0, "val_tau_b": 0.26},
        {
            "config": "fast+pad",
            "precision": "bf16-mixed",
            "frozen_layers": 3,
            "prompts_per_s": 140.0,
            "val_tau_b": 0.26,
        },
    ],
}


@pytest.fixture
def page(workdir, capsys):
    """The full page from the small metrics files above (no capacity or fidelity file: those say so)."""
    ranking = _ranking(
        {
            ("chatgpt", "chatgpt"): 0.421,
            ("chatgpt", "gpt-4-turbo"): 0.4,
            ("chatgpt", "smollm2"): 0.1,
            ("gpt-4-turbo", "gpt-4-turbo"): 0.486,
            ("recorded", "chatgpt"): 0.417,
            ("recorded", "gpt-4-turbo"): 0.45,
            ("recorded", "smollm2"): 0.19,
        }
    )
    files = {
        "metrics/ranking.json": ranking,
        "metrics/simulation.json": SIM,
        "metrics/engine_bench.json": BENCH,
        "metrics/scheduler_overhead.json": STALL,
        "metrics/choices/engine_draws.json": DRAWS,
        "metrics/sim_fidelity.json": {**FIDELITY, "requests": 200},
        "metrics/cold_repro.json": COLD,
        "metrics/train_throughput.json": SPEED,
        "metrics/train/recorded-pairwise.json": {"model": "recorded", "members": TRAINED_ON["members"]},
    }
    for name, data in files.items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(json.dumps(data))
    (workdir / "plots/evaluate").mkdir(parents=True)
    (workdir / "plots/evaluate/tau_b.png").write_bytes(b"png")
    rc, out, _ = run_cli(capsys, "report", "--ranking", "metrics/ranking.json")
    assert rc == 0 and (workdir / "metrics/report.md").read_text() == out
    return out


def test_summary_says_which_targets_are_met(page):
    head = page[: page.index("## Kendall")]
    assert head.startswith("# PARS results") and "**τ_b** is Kendall's rank correlation" in head
    assert (
        "**Served by default**: `models/export/pars-recorded`, the cross-model pairwise predictor `recorded`, " in head
    )
    assert "trained on chatgpt and gpt-4-turbo" in head
    met = next(line for line in head.splitlines() if line.startswith("- **Targets met"))
    missed = next(line for line in head.splitlines() if line.startswith("- **Not met"))
    assert "gpt-4-turbo test pairwise τ_b 0.486" in met and "chatgpt test pairwise τ_b 0.421" in missed
    assert "trained on: chatgpt 0.417, gpt-4-turbo 0.450 (target ≥ 0.35 on each; above TF-IDF + ridge, " in met
    assert "simulated chatgpt burst, FCFS / PARS mean per-token latency 3.60× (target ≥ 3×)" in met
    assert "simulated chatgpt burst, FCFS / PARS p90 2.40× (target ≥ 2×)" in met
    assert "PARS / oracle mean per-token latency 1.25× (target ≤ 1.5×)" in met  # 0.25 / 0.2
    assert "engine benchmark (one burst), FCFS / PARS mean per-token latency 2.50×" in met  # 4.0 / 1.6
    assert "wall time 0.010 % (target ≤ 0.5 %; the scoring thread's 2.5 % is not in it)" in met
    assert "(2000 arrivals at once, background scoring) 7.6 ms (target ≤ 50 ms)" in met
    assert "- With `scoring: inline` instead, the longest schedule() call holds the engine 18,402 ms." in head
    assert "(8 of 9)" in met and "(1 of 9)" in missed


def test_cross_model_row_names_its_members_and_marks_the_transfers(page):
    row = next(line for line in page.splitlines() if line.startswith("| cross-model pairwise (PARS): `recorded`"))
    cells = row.split(" | ")[1:]  # chatgpt, gpt-4-turbo, smollm2: in-domain, in-domain, a transfer
    assert "†" not in cells[0] and "†" not in cells[1] and "†" in cells[2]
    assert cells[0] == "0.417 [0.367, 0.467]"  # interval as [low, high], 3 decimals
    assert (
        "`recorded`: one predictor trained on the answers of chatgpt and gpt-4-turbo: its cells on them are "
        "in-domain, on smollm2 a transfer (†). It is the exported serving default, `models/export/pars-recorded`"
    ) in page
    assert "| recorded | **0.417** | **0.450** | 0.190 |" in page  # transfer table: in-domain in bold


def test_simulator_says_which_predictors_score_and_shows_overload(page):
    assert "{'pars'" not in page  # no raw dict
    assert "Scores: PARS and pointwise rank with the `chatgpt` predictors of their methods" in page
    assert (
        "Scores: PARS ranks with the cross-model predictor `recorded` (trained on chatgpt and gpt-4-turbo: a "
        "transfer to smollm2), the exported serving default; pointwise and listwise rank with the `smollm2` "
        "predictors of their methods (trained on smollm2's answers: in-domain). The policies compared use "
        "different checkpoints"
    ) in page
    assert "500 requests per load point (the seed is not recorded in `metrics/simulation.json`)" in page
    assert "Loads above 1 exceed capacity" in page and "transient overload" in page
    assert "| pars | 1.00 / 1.00 | 2.60 / 2.25 |" in page  # mean / p90 speedup
    assert "| fcfs | 0.1 | 18.9 |" in page and "| pars | 0.1 | 23.6 ↑ |" in page  # p90 TTFT, worse than FCFS
    assert "PARS's p90 time to first token is longer than FCFS's at load 1.25 (1.25: 23.6 s against 18.9 s)" in page
    assert "Engine **simulator, M 131,000**" in page


def test_engine_stall_and_cost_sections(page):
    assert "| PARS code in schedule(), % of wall time | scoring thread, % of wall time |" in page
    assert "| pars | 1.6000 | 3.0000 | 60.00 | 1.200 | 2.50× | 0.010 % | 2.5 % |" in page
    assert "Engine **vllm-cpu bench, M 23,168**" in page
    spread = next(line for line in page.splitlines() if line.startswith("Spread over draws"))
    assert "200 requests, 3 draws: geometric mean 1.99×, range 1.35–2.99×, 47 % of draws ≥ 2×" in spread
    assert "not run on the engine" in spread and "31.7 ms + 1.344 ms/token" in spread
    assert "(55.6 ms + 1.077 ms/token): the draws were made against an earlier calibration" in spread
    # the stall: milliseconds throughout, and a sentence reading it
    assert "| background | 7.6 | 0.05 | 0.28 | 993 | 21,658 |" in page
    assert "| inline | 18,402 | 18,402 | – | 1 | 18,403 |" in page
    assert "Background scoring spends at most 7.6 ms in PARS code per schedule() call (target ≤ 50 ms)" in page
    assert "inline scoring scores every arrival in one schedule() call, which holds the engine for 18,402 ms" in page
    # the cold repro: the 8 longest stages, every train stage, the previous run, what was skipped
    assert "**35.4 min** at commit `de184fc` (Xeon). The previous run: **58.2 min** at commit `a880334` (EPYC)." in page
    assert "| train@tiny | 1 | 2 |" in page and "| stage0 |" not in page and "| stage8 | 108 | – |" in page
    assert "Skipped, not in the total: `lengths`, `capacity`." in page
    # training throughput: before / after as the file names them, the speed-up over before, the setup
    assert "| full | before | 32-true | 0 | 20.0 | 1.00× | 0.280 |" in page
    assert "| fast |  | bf16-mixed | 3 | 100.0 | 5.00× | 0.260 |" in page  # a prefix of fast+pad: not the after
    assert "| fast+pad | after (default) | bf16-mixed | 3 | 140.0 | 7.00× | 0.260 |" in page
    assert "Setup: 60 optimiser steps × 2 repeats per setting, method pairwise, on chatgpt's pairs: 3,000" in page
    assert "*(no `metrics/capacity.json` yet: its section is left out)*" in page


def test_plots_are_linked_from_the_report_stage_page_with_their_sections(page):
    """The plot of each section shown is linked (the stage that writes the section's metrics writes it),
    whether or not the file is on disk: the page depends on its declared inputs only."""
    for plot in ("evaluate/tau_b.png", "evaluate/transfer.png", "engine_bench.png"):
        assert f"](../plots/{plot})" in page


def test_cross_model_members_unknown_and_no_serving_files(capsys, workdir):
    ranking = _ranking({("chatgpt", "chatgpt"): 0.5, ("recorded", "chatgpt"): 0.4, ("recorded", "smollm2"): 0.2})
    (workdir / "ranking.json").write_text(json.dumps(ranking))
    rc, out, _ = run_cli(capsys, "report", "--ranking", "ranking.json")
    assert rc == 0 and "which ones is not recorded (no `members` in `metrics/train/recorded-pairwise.json`)" in out
    row = next(line for line in out.splitlines() if line.startswith("| cross-model"))
    assert "†" not in row  # no members, no claim of a transfer
    assert "- **Not measured (8 of 9)**, no metrics file or figure: gpt-4-turbo test pairwise τ_b (target" in out
    assert "Served by default" not in out and "- **Targets met (1 of 9)**: chatgpt test pairwise τ_b 0.500" in out
    # no serving file: each section is a line naming its missing file, and no section of its own
    for name in "simulation engine_bench scheduler_overhead sim_fidelity capacity cold_repro train_throughput".split():
        assert f"*(no `metrics/{name}.json` yet: its section is left out)*" in out
    assert "## Engines on this page" not in out and "## Cost" not in out and "## Training throughput" not in out


def test_summary_shows_a_blend_beside_the_pairwise_target_not_in_its_place():
    from pipeline.report import summary_lines

    ranking = _ranking({("chatgpt", "chatgpt"): 0.421, ("gpt-4-turbo", "gpt-4-turbo"): 0.486})
    ranking["predictors"]["chatgpt"]["pairwise+decoder"] = {"chatgpt": {"overall": _stat(0.448)}}
    lines = summary_lines(ranking, {}, {}, None)
    missed = next(line for line in lines if line.startswith("- **Not met"))
    assert "chatgpt test pairwise τ_b 0.421 (blended: `chatgpt/pairwise+decoder` 0.448) (target ≥ 0.45)" in missed
