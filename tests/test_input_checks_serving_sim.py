"""Bad input to the serving simulation commands (simulate, capacity, sim-fidelity, engine-fit): one
line naming the file, flag or params key, before any slow work, and no output lost on the way."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import PARAMS, one_line_error, params_file, params_section, run_cli
from test_sim_fidelity import _bench_file
from test_simulator import _synthetic_project

from pipeline.errors import PARSError

# ---------------------------------------------------------------- pars simulate

SIM = {
    "workloads": {"w": {"model": "m", "score_model": "m"}, "v": {"model": "m", "score_model": {"pars": "m"}}},
    "quality_curve": None,
    "policies": ["fcfs", "pars", "oracle"],
    "burst": 40,
    "poisson_loads": [1.0],
    "poisson_requests": 40,
    "seed": 0,
    "engine": {"M": 3000, "chunk": 64, "token_budget": 512, "max_num_seqs": 16, "block_size": 16, "step_c0": 0.01},
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A synthetic project (cwd) with the stage's outputs of an earlier run in place."""
    _synthetic_project(tmp_path, True, np.random.default_rng(5))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plots/simulation").mkdir(parents=True)
    for name in ("w_latency_cdf.png", "v_latency_cdf.png", "gone_burst_queue.png", "notes.png"):
        (tmp_path / "plots/simulation" / name).write_bytes(b"old")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics/simulation.json").write_text('{"old": true}')
    return tmp_path


def _sim_params(tmp_path: Path, **changes) -> Path:
    p = json.loads(json.dumps(SIM))
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        node = p
        for name in parents:
            node = node[name]
        node[key] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"simulate": p}))
    return path


def _outputs(root: Path) -> dict[str, bytes]:
    files = [*(root / "plots/simulation").glob("*"), root / "metrics/simulation.json"]
    return {str(f.relative_to(root)): f.read_bytes() for f in files}


def _damage_generations(root: Path) -> None:
    (root / "data/generations/m/generations.parquet").write_bytes(b"not parquet")


def _second_score(root: Path) -> None:
    """p000 scored twice by m/pairwise, the second time the other way round: once the first row won."""
    import pandas as pd

    path = root / "data/scores/scores.parquet"
    table = pd.read_parquet(path)
    again = table[(table.prompt_id == "p000") & (table.method == "pairwise")].assign(score=-99.0)
    pd.concat([table, again]).to_parquet(path, index=False)


def _nan_score(root: Path) -> None:
    import pandas as pd

    path = root / "data/scores/scores.parquet"
    table = pd.read_parquet(path)
    table.loc[(table.prompt_id == "p002") & (table.method == "pairwise"), "score"] = float("nan")
    table.to_parquet(path, index=False)


def _negative_length(root: Path) -> None:
    import pyarrow.parquet as pq

    path = root / "data/generations/m/generations.parquet"
    table = pq.read_table(path).to_pandas()
    table.loc[0, "output_tokens"] = -5  # once dropped without a word
    table.to_parquet(path, index=False)


@pytest.mark.parametrize(
    "changes, damage, named",
    [
        ({}, _damage_generations, "generations.parquet"),
        ({}, _negative_length, "negative output_tokens in 1 row(s)"),
        ({"engine__token_budget": 8}, None, "simulate.engine: token_budget 8 is below max_num_seqs 16"),
        ({"engine__block_size": 1_000_000}, None, "simulate.engine: block_size 1000000 exceeds M 3000"),
        ({"engine__M": 10**30}, None, "simulate.engine.M"),
        ({"engine__M": 100}, None, "simulate.engine.M 100 (block_size 16) must be larger"),  # longest request > M
        ({"poisson_loads": None}, None, "simulate.poisson_loads None: expected a list"),
        ({"policies": None}, None, "simulate.policies None: expected a list"),
        ({"engine__first_token_at_prefill": "false"}, None, "simulate.engine.first_token_at_prefill 'false'"),
        ({"quality_curve": {"workload": "w"}}, None, "simulate.quality_curve.noise_sigma None"),
        ({"quality_curve": {"workload": ["w"], "noise_sigma": [0.0]}}, None, "simulate.quality_curve.workload ['w']"),
        ({"policies": []}, None, "simulate.policies []: expected a list of policies to compare"),
        ({}, _second_score, "scores.parquet: train_model=m method=pairwise scores prompt_id 'p000' more than once"),
        (
            {},
            _nan_score,
            "scores.parquet: train_model=m method=pairwise has a non-finite score (nan) for prompt_id 'p002'",
        ),
    ],
)
def test_simulate_refuses_bad_input_and_keeps_the_last_outputs(capsys, project, changes, damage, named):
    if damage:
        damage(project)
    before = _outputs(project)
    rc, _, err = run_cli(capsys, "simulate", "--params", _sim_params(project, **changes), "--data-root", "data")
    one_line_error(rc, err, "simulate", named)
    assert _outputs(project) == before


def test_simulate_replaces_its_plots_and_removes_only_stale_ones(capsys, project):
    rc, _, err = run_cli(capsys, "simulate", "--params", _sim_params(project), "--data-root", "data")
    assert rc == 0, err
    plots = {f.name: f.read_bytes() for f in (project / "plots/simulation").glob("*")}
    assert "gone_burst_queue.png" not in plots  # a workload no longer run
    assert plots["notes.png"] == b"old"  # not a file simulate writes
    assert plots["w_latency_cdf.png"].startswith(b"\x89PNG") and "v_speedup_vs_load.png" in plots
    saved = json.loads((project / "metrics/simulation.json").read_text())
    assert set(saved["workloads"]) == {"w", "v"}


def test_the_table_marks_the_oracle_gap_missing_without_an_oracle(capsys, project):
    rc, out, err = run_cli(
        capsys, "simulate", "--params", _sim_params(project, policies=["fcfs", "pars"]), "--data-root", "data"
    )
    assert rc == 0, err
    rows = [line for line in out.splitlines() if line.startswith(("fcfs ", "pars "))]
    assert rows and all(line.split()[-1] == "–" for line in rows) and "nan" not in out


def test_a_partial_run_does_not_clobber_the_stage_outputs(capsys, project):
    params = _sim_params(project)
    before = _outputs(project)
    for extra in ([], ["--out", "elsewhere/simulation.json"], ["--plots", "elsewhere/plots"]):
        rc, _, err = run_cli(capsys, "simulate", "--params", params, "--data-root", "data", "--workload", "w", *extra)
        assert "part of simulate.workloads" in one_line_error(rc, err, "simulate", "--out", "--plots")
    assert _outputs(project) == before
    rc, _, err = run_cli(
        capsys, "simulate", "--params", params, "--data-root", "data", "--workload", "w",
        "--out", "elsewhere/simulation.json", "--plots", "elsewhere/plots",
    )  # fmt: skip
    assert rc == 0, err
    assert _outputs(project) == before
    assert set(json.loads((project / "elsewhere/simulation.json").read_text())["workloads"]) == {"w"}
    assert (project / "elsewhere/plots/w_latency_cdf.png").is_file()


@pytest.mark.parametrize(
    "score_model, named",
    [
        ({"pars": "recored"}, "simulate.workloads.w.score_model.pars 'recored': "),
        ("mm", "simulate.workloads.w.score_model 'mm': "),
        (
            {"pars": "m/pairwize"},
            "no 'pairwize' scores of train model 'm' (its methods: listwise, pairwise, pointwise)",
        ),
    ],
)
def test_a_mistyped_score_model_is_refused(capsys, project, score_model, named):
    before = _outputs(project)
    params = _sim_params(project, workloads__w__score_model=score_model)
    rc, _, err = run_cli(capsys, "simulate", "--params", params, "--data-root", "data")
    line = one_line_error(rc, err, "simulate", named)
    assert "known: m)" in line or "its methods" in line
    assert _outputs(project) == before


def test_without_a_score_file_learned_policies_are_skipped_with_a_note(capsys, project):
    (project / "data/scores/scores.parquet").unlink()  # the evaluate stage has not run: legitimate
    rc, out, err = run_cli(capsys, "simulate", "--params", _sim_params(project), "--data-root", "data")
    assert rc == 0, err
    assert "learned policies pars/pointwise/listwise skipped" in out


def test_the_simulator_refuses_engine_settings_it_would_misread():
    from pipeline.queueing.simulator import EngineConfig, burst, simulate

    base = dict(M=3000, chunk=64, token_budget=512, max_num_seqs=16, block_size=16, step_c0=0.01)
    for change, message in (
        ({"first_token_at_prefill": "false"}, "first_token_at_prefill 'false'"),
        ({"M": 10**30}, "engine setting M"),
        ({"block_size": 10**6}, "block_size 1000000 exceeds M 3000"),
        ({"token_budget": 8}, "token_budget 8 is below max_num_seqs 16"),
    ):
        with pytest.raises(ValueError, match=message):
            simulate(burst(3), [10, 10, 10], [5, 5, 5], config=EngineConfig(**{**base, **change}))
    # a huge max_num_seqs is a valid limit, not an allocation
    assert (
        simulate(
            burst(3), [10] * 3, [5] * 3, config=EngineConfig(**{**base, "max_num_seqs": 10**11, "token_budget": 10**11})
        ).steps
        > 0
    )


# ---------------------------------------------------------------- pars capacity


@pytest.mark.parametrize(
    "stage, changes, named",
    [
        (True, {"token_budget": 16}, "capacity: token_budget 16 is below max_num_seqs 256"),
        (True, {"block_size": 200000}, "capacity: block_size 200000 exceeds M 131000"),
        (False, {"margn": 0.5}, "capacity.margn: not a setting here (did you mean 'margin'?"),
    ],
)
def test_capacity_params_are_checked_up_front(capsys, tmp_path, monkeypatch, stage, changes, named):
    monkeypatch.chdir(tmp_path)
    params = params_file(tmp_path, "capacity", changes)
    rc, _, err = run_cli(capsys, "capacity", "--params", params, *(["--stage"] if stage else ["--rate", "1"]))
    one_line_error(rc, err, "capacity", named)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


@pytest.mark.parametrize("bad", [-5, None])
def test_capacity_lengths_refuses_negative_or_missing_counts(capsys, tmp_path, bad):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.contracts import GENERATIONS

    rows = 4
    columns = {name: [None] * rows for name in GENERATIONS.names}
    columns.update(prompt_id=["a", "b", "c", "d"], sample=[0] * rows, finish_reason=["stop"] * rows)
    columns.update(prompt_tokens=[10, 20, 30, bad], output_tokens=[5, 0, 7, 8])  # an empty answer (0) is fine
    path = tmp_path / "gen.parquet"
    pq.write_table(pa.table(columns, schema=GENERATIONS), path)
    rc, _, err = run_cli(capsys, "capacity", "--rate", "1", "--lengths", path)
    assert "1 of 4 rows have a negative or missing" in one_line_error(rc, err, "capacity", path)


# ---------------------------------------------------------------- pars sim-fidelity


def _edit(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def _set(dotted: str, value):
    def fn(data):
        *parents, key = dotted.split(".")
        node = data
        for name in parents:
            node = node[int(name)] if isinstance(node, list) else node[name]
        if value is _DELETE:
            del node[key]
        elif isinstance(node, list):
            node[int(key)] = value
        else:
            node[key] = value

    return fn


_DELETE = object()


@pytest.mark.parametrize(
    "which, edit, named",
    [
        ("val", _set("setup.starvation_s", -5), "setup.starvation_s -5"),
        ("val", _set("setup.starvation_s", 0), "setup.starvation_s 0"),
        ("val", _set("setup.starvation_s", math.nan), "setup.starvation_s nan"),
        ("val", _set("setup", [1]), "setup [1]: must be a mapping"),
        ("cal", _set("pars.pars_stats.score_s", -1.0), "pars.pars_stats.score_s -1.0: must be positive"),
        ("val", _set("fcfs.per_request.per_token_latency", [0.1]), "fcfs.per_request.per_token_latency"),
        ("val", _set("oracle.per_request", {}), "oracle.per_request.per_token_latency must list"),
        ("cal", _set("fcfs.step_fit.c0_s", math.nan), "fcfs.step_fit.c0_s nan"),
        ("cal", _set("pars.step_fit.c0_s", -0.01), "pars.step_fit.c0_s -0.01: must be a finite number >= 0"),
        ("val", _set("pars.engine.M", "8160"), "pars.engine.M '8160'"),
        ("cal", _set("fcfs.engine.M", "8160"), "fcfs.engine.M '8160'"),
        ("val", _set("pars.scoring_batch_size", "x"), "pars.scoring_batch_size 'x'"),
        ("val", _set("pars.scoring_batch_size", 0), "pars.scoring_batch_size 0"),
        ("val", _set("setup.checkpoint_typical_score", "x"), "setup.checkpoint_typical_score 'x'"),
        ("val", _set("workload.output_tokens.0", 0), "workload.output_tokens[0] 0"),
        ("val", _set("workload.output_tokens.0", 2.5), "workload.output_tokens[0] 2.5"),
        ("val", _set("fcfs.mean_ttft", 0), "fcfs.mean_ttft 0: must be positive"),
        ("val", _set("pars.engine.token_budget", 2), "pars.engine: token_budget 2 is below max_num_seqs 4"),
    ],
)
def test_sim_fidelity_checks_the_bench_files_up_front(tmp_path, monkeypatch, which, edit, named):
    from pipeline import sim_fidelity as stage

    monkeypatch.chdir(tmp_path)
    files = {
        "cal": _bench_file(tmp_path / "cal.json", seed=1, c0=0.02, c1=1e-4),
        "val": _bench_file(tmp_path / "val.json", seed=2, c0=0.02, c1=1e-4),
    }
    _edit(files[which], edit)
    replayed = []
    monkeypatch.setattr(stage, "replay", lambda *a, **k: replayed.append(1))  # the checks come first
    with pytest.raises(PARSError) as info:
        stage.run({"calibration": str(files["cal"]), "validation": str(files["val"])})
    assert str(files[which]) in str(info.value) and named in str(info.value), info.value
    assert not replayed and not (tmp_path / "metrics").exists()


@pytest.mark.parametrize("value", [None, "", 5])
def test_sim_fidelity_params_name_the_key(capsys, tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    params = params_file(tmp_path, "sim_fidelity", {"calibration": value})
    rc, _, err = run_cli(capsys, "sim-fidelity", "--params", params)
    one_line_error(rc, err, "sim-fidelity", f"sim_fidelity.calibration {value!r}")


def test_sim_fidelity_takes_null_starvation_as_no_rule(tmp_path, monkeypatch):
    from pipeline import sim_fidelity as stage

    monkeypatch.chdir(tmp_path)
    cal = _bench_file(tmp_path / "cal.json", seed=1, c0=0.02, c1=1e-4)
    val = _bench_file(tmp_path / "val.json", seed=2, c0=0.02, c1=1e-4)
    _edit(val, _set("setup.starvation_s", None))
    assert stage.run({"calibration": str(cal), "validation": str(val)})["requests"] == 60


# ---------------------------------------------------------------- pars engine-fit (no engine starts)


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--requests", "1"], "--requests 1: must be at least 5"),
        (
            ["--prompt", "4000:5000", "--answer", "4000:5000"],
            "does not fit in the KV cache (256 blocks x 32 tokens, 8160 usable",
        ),
        (["--max-num-seqs", "512", "--budget", "256"], "--token-budget 256: must be at least --max-num-seqs 512"),
        (["--blocks", "1"], "--blocks 1"),
        (["--seed", str(2**70)], "--seed"),
        (["--block-size", str(10**9)], "--block-size"),
    ],
)
def test_engine_fit_refuses_flags_before_the_engine(capsys, tmp_path, monkeypatch, model_dir, flags, named):
    import pipeline.engine_fit as stage

    monkeypatch.setattr(stage, "run_engine", lambda *a, **k: pytest.fail("the engine started"))
    out = tmp_path / "fit.json"
    rc, _, err = run_cli(capsys, "engine-fit", "--params", PARAMS, "--model", model_dir, "--out", out, *flags)
    one_line_error(rc, err, "engine-fit", named)
    assert not out.exists()


def test_engine_fit_model_must_hold_a_config(capsys, tmp_path, monkeypatch):
    import pipeline.engine_fit as stage

    monkeypatch.setattr(stage, "run_engine", lambda *a, **k: pytest.fail("the engine started"))
    rc, _, err = run_cli(capsys, "engine-fit", "--params", PARAMS, "--model", tmp_path, "--out", tmp_path / "fit.json")
    assert "no config.json" in one_line_error(rc, err, "engine-fit", f"--model {tmp_path}")


def _fake_engine(same_finish: bool):
    """run_engine's record of a burst, without an engine: steps of c0 + c1 * tokens."""

    def run_engine(model, s, o, *, blocks, block_size, **_):
        rng = np.random.default_rng(0)
        tokens = rng.integers(8, 200, 120)
        step_time = 0.01 + 1e-5 * tokens
        step_end = np.cumsum(step_time)
        at = np.full(len(s), 119) if same_finish else np.linspace(20, 119, len(s)).astype(int)
        return {
            "M": (blocks - 1) * block_size,
            "block_size": block_size,
            "blocks": blocks,
            "step_time": step_time,
            "step_end": step_end,
            "tokens": tokens,
            "seqs": rng.integers(1, 8, 120),
            "finish": step_end[at],
        }

    return run_engine


def test_engine_fit_writes_its_json_atomically(capsys, tmp_path, monkeypatch, model_dir):
    import pipeline.contracts
    import pipeline.engine_fit as stage

    monkeypatch.setattr(stage, "run_engine", _fake_engine(same_finish=False))
    written = []
    real = pipeline.contracts.write_json
    monkeypatch.setattr(pipeline.contracts, "write_json", lambda obj, path: written.append(path) or real(obj, path))
    out = tmp_path / "fit.json"
    rc, _, err = run_cli(
        capsys, "engine-fit", "--params", PARAMS, "--model", model_dir, "--requests", "8", "--out", out
    )
    assert rc == 0, err
    assert written == [str(out)] and json.loads(out.read_text())["requests"] == 8


def test_engine_fit_writes_no_nan_fit(capsys, tmp_path, monkeypatch, model_dir):
    import pipeline.engine_fit as stage

    monkeypatch.setattr(stage, "run_engine", _fake_engine(same_finish=True))
    out = tmp_path / "fit.json"
    rc, _, err = run_cli(
        capsys, "engine-fit", "--params", PARAMS, "--model", model_dir, "--requests", "8", "--out", out
    )
    one_line_error(rc, err, "engine-fit", "--requests 8")
    assert not out.exists()


def test_engine_fit_check_args_accepts_the_defaults(model_dir):
    from pipeline.engine_fit import METRICS, SETTINGS, check_args, resolve_settings

    args = argparse.Namespace(**dict.fromkeys(SETTINGS), params=PARAMS, model=str(model_dir), out=METRICS)
    names = resolve_settings(args)
    check_args(args, names)
    assert names["chunk"].endswith("engine_fit.chunk") and args.prompt == params_section("engine_fit")["prompt"]


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"requests": 2}, "p.yaml: engine_fit.requests 2: must be at least 5"),
        ({"prompt": "16-192"}, "p.yaml: engine_fit.prompt '16-192': expected uniform:LO:HI"),
        ({"token_budget": 8}, "engine_fit.token_budget 8: must be at least"),
        ({"budget": 256}, "engine_fit.budget: not a setting here (did you mean 'token_budget'?"),
        ({"seed": "many"}, "p.yaml: engine_fit.seed 'many': must be an integer"),
    ],
)
def test_engine_fit_names_the_params_key_of_a_bad_setting(capsys, tmp_path, monkeypatch, model_dir, changes, named):
    import pipeline.engine_fit as stage

    monkeypatch.setattr(stage, "run_engine", lambda *a, **k: pytest.fail("the engine started"))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"engine_fit": params_section("engine_fit", **changes)}))
    out = tmp_path / "fit.json"
    rc, _, err = run_cli(capsys, "engine-fit", "--params", tmp_path / "p.yaml", "--model", model_dir, "--out", out)
    one_line_error(rc, err, "engine-fit", named)
    assert not out.exists()
