"""Bad evaluate / blend params and output paths, a bad Scorer batch size and bad PARS scheduler
settings: one line naming the key, flag or variable, before anything loads or is scored."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import one_line_error, params_file, run_cli

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def evaluate_cli(capsys, tmp_path, params, *extra):
    # no data and no models here: a check that came after reading them would name those instead
    argv = ["evaluate", "--params", params, "--data", tmp_path / "data", "--models", tmp_path / "models"]
    argv += ["--metrics", tmp_path / "metrics", "--plots", tmp_path / "plots", *extra]
    return run_cli(capsys, *argv)


@pytest.mark.parametrize(
    "key, value",
    [
        ("batch_size", -1),
        ("batch_size", 0),
        ("batch_size", "big"),
        ("delta", 2.0),
        ("delta", 0),
        ("delta", "x"),
        ("bootstrap.n", -1),
        ("bootstrap.seed", "abc"),
        ("bootstrap.seed", -1),
        ("bootstrap.level", 1.5),
        ("bootstrap", 5),
        ("torch_threads", -1),
        ("torch_threads", 0),
        ("precision", "fp8"),
        ("device", "gpu0"),
        ("device", "cuda:7"),  # a GPU this machine lacks (none has 8 here)
        ("device", None),
        ("tfidf_ridge.ngram_max", 0),
        ("tfidf_ridge.min_df", 0),
        ("tfidf_ridge.alphas", []),
        ("tfidf_ridge.alphas", [1, -2]),
        ("tfidf_ridge.alphas", "abc"),
        ("tfidf_ridge.min_train_prompts", 0),
        ("train_models", "chatgpt"),
        ("methods", 5),
        ("methods", ["pairwise", "pairwize"]),
        ("eval_models", [1, 2]),
        ("wandb.enabled", "yes"),
        ("baseline_tokenizer", "minilm/l6/x"),  # not a directory, nor a hub id
    ],
)
def test_evaluate_refuses_a_bad_param_before_loading(capsys, tmp_path, key, value):
    params = params_file(tmp_path, "evaluate", {key: value})
    rc, _, err = evaluate_cli(capsys, tmp_path, params)
    one_line_error(rc, err, "evaluate", f"evaluate.{key}")


def test_evaluate_default_params_pass_the_checks():
    from pipeline.evaluate import check_params
    from pipeline.params import load_params

    settings = check_params(load_params("evaluate", PARAMS))
    assert settings["batch_size"] >= 1 and 0 < settings["delta"] < 1 and settings["n_boot"] >= 1


@pytest.mark.parametrize("flag", ["--metrics", "--plots", "--data"])
def test_evaluate_output_in_the_way_is_refused_before_scoring(capsys, tmp_path, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    rc, _, err = evaluate_cli(capsys, tmp_path, PARAMS, flag, blocker)
    # named before the missing predictors (which are checked before any scoring)
    one_line_error(rc, err, "evaluate", blocker)
    assert not (tmp_path / "data").exists() and blocker.read_text() == "not a directory"


def test_evaluate_plots_dir_holding_the_data_is_refused(capsys, tmp_path):
    rc, _, err = evaluate_cli(capsys, tmp_path, PARAMS, "--plots", tmp_path)
    one_line_error(rc, err, "evaluate", "plots directory")


def blend_cli(capsys, tmp_path, params, *extra):
    argv = ["blend", "--model", "toy", "--params", params, "--data", tmp_path / "data"]
    argv += ["--models", tmp_path / "models", "--metrics", tmp_path / "metrics", "--plots", tmp_path / "plots"]
    return run_cli(capsys, *argv, *extra)


def blend_params(tmp_path: Path, key: str, value, **more) -> Path:
    data = yaml.safe_load(PARAMS.read_text(encoding="utf-8"))
    data["blend"].update({"predictors": {"toy": "pairwise"}, "features": "tfidf", **more})
    *parents, last = key.split(".")
    node = data["blend"]
    for name in parents:
        node = node[name]
    node[last] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "key, value, more",
    [
        ("predictors", ["toy"], {}),
        ("predictors.toy", 5, {}),
        ("tfidf.alphas", [], {}),
        ("tfidf.alphas", [0, 1], {}),
        ("tfidf.ngram_max", 0, {}),
        ("tfidf.min_df", 0, {}),
        ("encoder_weights", [], {}),
        ("encoder_weights", [0.5, 1.5], {}),
        ("encoder_weights", "all", {}),
        ("decoder.layers", [], {"features": "decoder"}),
        ("decoder.batch_size", 0, {"features": "decoder"}),
        ("decoder.alphas", [-1], {"features": "decoder"}),
        ("features", "bag", {}),
    ],
)
def test_blend_refuses_a_bad_param_before_scoring(capsys, tmp_path, key, value, more):
    rc, _, err = blend_cli(capsys, tmp_path, blend_params(tmp_path, key, value, **more))
    # no models/toy/pairwise here: a later check would name the checkpoint instead
    one_line_error(rc, err, "blend", f"blend.{key}")


def test_blend_default_params_pass_the_checks():
    from pipeline.blend import check_params
    from pipeline.params import load_params

    params = load_params("blend", PARAMS)
    params["predictors"] = {"toy": "pairwise"}
    # machine=False: the default decoder (models/base/...) exists only after `dvc repro materialize`
    assert check_params("toy", params, machine=False) == ("pairwise", "decoder")
    params["features"] = "tfidf"
    assert check_params("toy", params) == ("pairwise", "tfidf")


@pytest.mark.parametrize("flag", ["--metrics", "--plots"])
def test_blend_output_in_the_way_is_refused_first(capsys, tmp_path, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    rc, _, err = blend_cli(capsys, tmp_path, blend_params(tmp_path, "features", "tfidf"), flag, blocker)
    one_line_error(rc, err, "blend", blocker)


def test_scorer_refuses_a_bad_batch_size_or_max_length(tmp_path):
    from pipeline.serving.scorer import Scorer, _length_sorted_batches

    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="batch_size"):
            Scorer(None, None, {"max_length": 32}, batch_size=bad)
        with pytest.raises(ValueError, match="batch_size"):  # before the (absent) checkpoint loads
            Scorer.from_pretrained(tmp_path / "none", batch_size=bad)
    for bad in (None, 1, "32", 2.0):
        with pytest.raises(ValueError, match="max_length"):
            Scorer(None, None, {"max_length": bad})
    with pytest.raises(ValueError, match="batch_size"):  # a score(..., batch_size=-1) override
        list(_length_sorted_batches([[1, 2], [3]], 0, -1, False))


def test_pars_config_checks_a_directly_built_config(tmp_path):
    from pipeline.ranking.checkpoint import CheckpointError
    from pipeline.serving.pars_config import MAX_BATCH_SIZE, PARSConfig, PARSConfigError

    for bad in (
        {"batch_size": -1},
        {"scoring": "nope"},
        {"device": "meta"},
        {"device": "cpu:7"},
        {"device": "cuda:999"},
        {"batch_size": 10**30},
        {"batch_size": MAX_BATCH_SIZE + 1},
        {"starvation_s": 0},
    ):
        with pytest.raises(PARSConfigError, match=f"PARSConfig.{next(iter(bad))}") as info:
            PARSConfig(**bad)
        assert "\n" not in str(info.value)
    with pytest.raises(CheckpointError, match="does not exist") as info:
        PARSConfig(checkpoint=str(tmp_path / "nope"))
    assert isinstance(info.value, PARSConfigError)
    config = PARSConfig(checkpoint=str(tmp_path), batch_size="3", device="cpu")
    assert config.batch_size == 3 and PARSConfig().batch_size == 32


def test_pars_config_from_sources_names_the_source(tmp_path):
    from pipeline.serving.pars_config import PARSConfig, PARSConfigError

    with pytest.raises(PARSConfigError, match=r"additional_config\['pars'\]\['batch_size'\]"):
        PARSConfig.from_sources({"batch_size": 10**400}, env={})
    with pytest.raises(PARSConfigError, match=r"additional_config\['pars'\]\['device'\]"):
        PARSConfig.from_sources({"device": "meta"}, env={})
    with pytest.raises(PARSConfigError, match="PARS_CHECKPOINT.*does not exist"):
        PARSConfig.from_sources(None, env={"PARS_CHECKPOINT": str(tmp_path / "nope")})
    # a misspelled setting is named, not ignored; the project's other PARS_* variables are left alone
    with pytest.raises(PARSConfigError, match="PARS_BATCHSIZE") as info:
        PARSConfig.from_sources(None, env={"PARS_BATCHSIZE": "-1"})
    assert "\n" not in str(info.value) and "PARS_BATCH_SIZE" in str(info.value)
    env = {"PARS_DEBUG": "1", "PARS_PARAMS": "p.yaml", "PARS_BATCH_SIZE": "4"}
    assert PARSConfig.from_sources(None, env=env).batch_size == 4
