"""Bad evaluate inputs, found by review: refused in one line naming the file, key or flag, before the
scoring and before any output is replaced; a wrong --plots deletes nothing but evaluate's own plots."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import one_line_error, params_file, run_cli
from test_bad_params_evaluate import PARAMS, evaluate_cli
from test_evaluate import TFIDF, _make_data, project  # noqa: F401  (project: the tiny-predictor fixture)

from pipeline.contracts import GENERATIONS, generations_path, scores_path, write_table

M1 = generations_path("m1", Path("data"))  # as run() names it (cwd = the project)


def stage(capsys, root: Path, params: dict, *extra):
    """`pars evaluate` on the project fixture's data and predictors (cwd = root), without W&B."""
    (root / "params.yaml").write_text(yaml.safe_dump({"evaluate": params}))
    return run_cli(capsys, "evaluate", "--params", "params.yaml", "--no-wandb", *extra)


def assert_nothing_scored_or_written(out: str) -> None:
    assert "scoring" not in out  # refused before the slow work
    assert not Path("metrics/ranking.json").exists() and not scores_path(Path("data")).exists()


# ---------------------------------------------------------------- 1. the plots directory


def test_plots_replace_only_their_own_files(project, capsys):  # noqa: F811
    root, params = project
    plots = root / "out/plots"
    (plots / "keep").mkdir(parents=True)
    (plots / "keep/x.txt").write_text("x")
    (plots / "notes.txt").write_text("mine")
    (plots / "tau_b.csv").write_text("stale")
    rc, _, err = stage(capsys, root, params, "--plots", plots)
    assert rc == 0, err
    assert (plots / "notes.txt").read_text() == "mine" and (plots / "keep/x.txt").read_text() == "x"
    assert (plots / "tau_b.csv").read_text() != "stale"
    assert all((plots / name).stat().st_size > 0 for name in ("tau_b.csv", "tau_b.png", "transfer.png"))


# ---------------------------------------------------------------- 2, 3. bad generations, before scoring


def _unknown(g):
    return pd.concat([g, g.head(1).assign(prompt_id="ghost-000")], ignore_index=True)


def _null(g):
    g.loc[0, "prompt_id"] = None
    return g


def _negative(g):
    g.loc[0, "output_tokens"] = -5
    return g


def _cut(g):
    g.loc[0, "finish_reason"] = "cut"
    return g


def _duplicate(g):
    return pd.concat([g, g.head(1)], ignore_index=True)


def _empty(g):
    return g.iloc[:0]


@pytest.mark.parametrize("damage", [_unknown, _null, _negative, _cut, _duplicate, _empty])
def test_bad_generations_are_refused_naming_the_file_before_scoring(project, capsys, damage):  # noqa: F811
    root, params = project
    path = root / M1
    write_table(damage(pd.read_parquet(path)), path, GENERATIONS)
    rc, out, err = stage(capsys, root, params)
    one_line_error(rc, err, "evaluate", M1)
    assert_nothing_scored_or_written(out)


def test_a_late_failure_replaces_no_output(project, capsys, monkeypatch):  # noqa: F811
    import pipeline.evaluate as E

    root, params = project
    old = scores_path(Path("data"))
    old.parent.mkdir(parents=True)
    old.write_bytes(b"the last run's scores")

    def fail(*args, **kwargs):
        raise ValueError("a metric failed")

    monkeypatch.setattr(E, "evaluate", fail)
    rc, _, err = stage(capsys, root, params)
    assert rc != 0 and err.rstrip().endswith("pars evaluate: error: a metric failed")  # after the progress bars
    assert old.read_bytes() == b"the last run's scores" and not Path("metrics/ranking.json").exists()


# ---------------------------------------------------------------- 4, 5. params that passed the checks


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"cross_models": ["smollm2"]}, "cross_models"),  # smollm2/pairwise is in train_models x methods
        ({"methods": ["pairwise", "pairwise"]}, "methods"),
        ({"blends": ["smollm2/pairwise+tfidf", "smollm2/pairwise+tfidf"]}, "blends"),
        ({"blends": ["smollm2/pairwise"]}, "blends"),
        ({"eval_models": ["smollm2", "smollm2"]}, "eval_models"),
        ({"train_models": [], "cross_models": [], "blends": []}, "train_models"),  # no predictor at all
        ({"methods": [], "cross_models": None, "blends": []}, "train_models"),
        ({"eval_models": []}, "eval_models"),
        ({"bootstrap.n": 1}, "bootstrap.n"),
        ({"wandb.mode": "sometimes"}, "wandb.mode"),
    ],
)
def test_params_that_failed_late_are_refused_up_front(capsys, tmp_path, changes, key):
    rc, _, err = evaluate_cli(capsys, tmp_path, params_file(tmp_path, "evaluate", changes))
    one_line_error(rc, err, "evaluate", f"evaluate.{key}")


def test_a_bad_wandb_mode_variable_is_refused_up_front(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    rc, _, err = evaluate_cli(capsys, tmp_path, PARAMS)
    one_line_error(rc, err, "evaluate", "WANDB_MODE")


@pytest.mark.parametrize("make", [lambda p: p.write_text("x"), lambda p: p.mkdir()])
def test_a_baseline_tokenizer_path_that_holds_no_tokenizer_is_refused(capsys, tmp_path, make):
    not_a_tokenizer = tmp_path / "tok"
    make(not_a_tokenizer)
    params = params_file(tmp_path, "evaluate", {"baseline_tokenizer": str(not_a_tokenizer)})
    rc, _, err = evaluate_cli(capsys, tmp_path, params)
    one_line_error(rc, err, "evaluate", "evaluate.baseline_tokenizer")


def test_min_df_no_term_reaches_names_the_key_before_scoring(project, capsys):  # noqa: F811
    root, params = project
    rc, out, err = stage(capsys, root, {**params, "tfidf_ridge": {**TFIDF, "min_df": 100000}})
    one_line_error(rc, err, "evaluate", "evaluate.tfidf_ridge.min_df")
    assert_nothing_scored_or_written(out)


def test_plots_draw_an_interval_that_misses_its_estimate(tmp_path):
    from pipeline.evaluate import PLOT_FILES, evaluate, transfer_matrix, write_plots

    prompts, _ = _make_data(tmp_path)
    gens = {m: pd.read_parquet(generations_path(m, tmp_path)) for m in ("m4", "m1")}
    test = prompts[prompts["split"] == "test"]
    scores = test[["prompt_id", "dataset"]].assign(train_model="m4", method="pairwise", score=np.arange(len(test)))
    ptoks = pd.Series(test["prompt"].str.len().to_numpy(dtype=float), index=test["prompt_id"])
    ranking = evaluate(prompts, gens, scores, ptoks, delta=0.2, n_boot=2, seed=0, level=0.95, tfidf_ridge=TFIDF)
    cell = ranking["predictors"]["m4"]["pairwise"]["m4"]["overall"]
    cell["ci_low"] = cell["kendall_tau_b"] + 0.1  # a percentile interval of few resamples can lie above it
    write_plots(ranking, transfer_matrix(ranking), tmp_path / "plots")
    assert all((tmp_path / "plots" / name).exists() for name in PLOT_FILES)
