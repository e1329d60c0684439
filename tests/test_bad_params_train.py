"""Bad `train` and `pairs` params and output flags: ONE stderr line `pars <cmd>: error: ...` naming
the key or flag, exit 1, found before any data is read (the --data dirs here do not exist, so a
check that came later would report the missing data instead) and before any output is deleted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import one_line_error, params_file, run_cli, write_dataset

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def train(capsys, tmp_path, params, *extra):
    return run_cli(
        capsys,
        "train",
        "--model",
        "toy",
        "--params",
        params,
        "--data",
        tmp_path / "no-data",
        "--models",
        tmp_path / "models",
        "--metrics",
        tmp_path / "metrics",
        "--plots",
        tmp_path / "plots",
        *extra,
    )


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no hub request from a test


TRAIN_BAD = [
    ({"epochs": -1}, "train.epochs"),
    ({"epochs": "two"}, "train.epochs"),
    ({"batch_size": -1}, "train.batch_size"),
    ({"batch_size": "big"}, "train.batch_size"),
    ({"eval_batch_size": 0}, "train.eval_batch_size"),
    ({"length_buckets": -3}, "train.length_buckets"),
    ({"micro_batches": 0}, "train.micro_batches"),
    ({"patience": -1}, "train.patience"),
    ({"warmup_fraction": 2.0}, "train.warmup_fraction"),
    ({"lr": "fast"}, "train.lr"),
    ({"lr": 0}, "train.lr"),
    ({"weight_decay": -0.1}, "train.weight_decay"),
    ({"grad_clip": -1.0}, "train.grad_clip"),
    ({"dropout": 1.0}, "train.dropout"),
    ({"torch_threads": 0}, "train.torch_threads"),
    ({"num_workers": -1}, "train.num_workers"),
    ({"max_train_prompts": -5}, "train.max_train_prompts"),
    ({"frozen_layers": -1}, "train.frozen_layers"),
    ({"frozen_layers": 7}, "train.frozen_layers"),  # minilm-l6 has 6 layers
    ({"max_length": 1000}, "train.max_length"),  # it has 512 positions
    ({"max_length": 0}, "train.max_length"),
    ({"head_fraction": 1.5}, "train.head_fraction"),
    ({"margin": -1.0}, "train.margin"),
    ({"margin_per_log_length": -1.0}, "train.margin_per_log_length"),
    ({"seed": -1}, "train.seed"),
    ({"seed": "abc"}, "train.seed"),
    ({"seed": 2**40}, "train.seed"),  # Lightning would refuse it late
    ({"pooling": "max"}, "train.pooling"),
    ({"pairwise_mode": "sometimes"}, "train.pairwise_mode"),
    ({"pairwise_mode": "per_pair", "frozen_layers": 2}, "train.frozen_layers"),
    ({"cross_models": ["a", "b"]}, "train.cross_models"),
    ({"models": "chatgpt"}, "train.models"),
    ({"lexical_prior": "yes"}, "train.lexical_prior"),
    ({"lexical_prior.folds": 1}, "train.lexical_prior.folds"),
    ({"lightning.num_nodes": 0}, "train.lightning.num_nodes"),
    ({"lightning.precision": "bf61"}, "train.lightning.precision"),
    ({"encoder": "no such encoder"}, "train.encoder"),
    ({"encoder": ""}, "train.encoder"),  # Path("") is ".", which exists
    ({"encoder": "  "}, "train.encoder"),
]


@pytest.mark.parametrize(("changes", "key"), TRAIN_BAD, ids=[str(c) for c, _ in TRAIN_BAD])
def test_bad_train_params_fail_in_one_line_before_the_data(capsys, tmp_path, changes, key):
    rc, _, err = train(capsys, tmp_path, params_file(tmp_path, "train", changes))
    assert rc == 1
    line = one_line_error(rc, err, "train", f"params.yaml: {key} ", f"params.yaml: {key}:")
    assert "no pairs" not in line


def test_a_mistyped_encoder_fails_at_once_naming_the_key_and_the_known_names(capsys, tmp_path):
    t0 = time.perf_counter()
    rc, _, err = train(capsys, tmp_path, params_file(tmp_path, "train", {"encoder": "minilm-l7"}))
    assert rc == 1 and time.perf_counter() - t0 < 20  # no minute of hub retries
    line = one_line_error(rc, err, "train", "train.encoder 'minilm-l7'")
    assert "minilm-l6" in line and "cache" in line


def test_lightning_settings_this_install_cannot_run_are_refused(capsys, tmp_path):
    import importlib.util

    for changes, key in (
        ({"lightning.accelerator": "tpu"}, "train.lightning.accelerator"),
        ({"lightning.accelerator": "quantum"}, "train.lightning.accelerator"),
        ({"lightning.strategy": "dpp"}, "train.lightning.strategy"),
        ({"lightning.strategy": "ddp_spawn"}, "train.lightning.strategy"),
        ({"lightning.devices": 0}, "train.lightning.devices 0: `devices` selected with `CPUAccelerator`"),
        ({"lightning.devices": "two"}, "train.lightning.devices 'two'"),
        ({"lightning.devices": 1.5}, "train.lightning.devices 1.5"),
        ({"lightning.devices": True}, "train.lightning.devices True: must be auto"),
    ):
        rc, _, err = train(capsys, tmp_path, params_file(tmp_path, "train", changes))
        assert rc == 1
        line = one_line_error(rc, err, "train", key)
        if changes.get("lightning.accelerator") == "tpu" and importlib.util.find_spec("torch_xla") is None:
            assert "torch_xla" in line


def test_the_default_train_params_pass_the_checks(capsys, tmp_path):
    from pipeline.params import load_params
    from pipeline.ranking.losses import METHODS
    from pipeline.train import check_params

    check_params(load_params("train", PARAMS), list(METHODS))
    rc, _, err = train(capsys, tmp_path, PARAMS)  # on to the data, which is missing
    one_line_error(rc, err, "train", "no pairs for model 'toy'")


@pytest.mark.parametrize("flag", ["--models", "--metrics", "--plots"])
def test_train_output_flag_that_is_a_file_is_refused_first(capsys, tmp_path, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    rc, _, err = train(capsys, tmp_path, PARAMS, flag, blocker)
    one_line_error(rc, err, "train", flag)


def test_train_model_name_must_stay_under_models(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "train", "--model", "..", "--params", PARAMS, "--data", tmp_path)
    one_line_error(rc, err, "train", "--model")


PAIRS_BAD = [
    ({"models": "chatgpt"}, "pairs.models"),
    ({"delta": 2.0}, "pairs.delta"),
    ({"delta": 0}, "pairs.delta"),
    ({"delta": "big"}, "pairs.delta"),
    ({"delta": float("nan")}, "pairs.delta"),
    ({"partners": 2.7}, "pairs.partners"),
    ({"partners": 0}, "pairs.partners"),
    ({"max_tries_factor": 0}, "pairs.max_tries_factor"),
    ({"max_tries_factor": 1e12}, "pairs.partners"),  # the draws per prompt would not fit in memory
    ({"max_tries_factor": 2.5}, "pairs.max_tries_factor"),
    ({"seed": -1}, "pairs.seed"),
    ({"seed": "abc"}, "pairs.seed"),
]


@pytest.mark.parametrize(("changes", "key"), PAIRS_BAD, ids=[str(c) for c, _ in PAIRS_BAD])
def test_bad_pairs_params_fail_in_one_line_before_the_data(capsys, tmp_path, changes, key):
    params = params_file(tmp_path, "pairs", changes)
    rc, _, err = run_cli(capsys, "pairs", "--model", "toy", "--params", params, "--data", tmp_path / "no-data")
    assert rc == 1
    one_line_error(rc, err, "pairs", f"params.yaml: {key} ", f"params.yaml: {key}:")


@pytest.mark.parametrize("flag", ["--metrics", "--data"])
def test_pairs_output_problem_is_found_before_the_old_pairs_are_deleted(capsys, tmp_path, flag):
    data = tmp_path / "data"
    write_dataset(data)
    old = data / "pairs" / "toy" / "train.parquet"
    old.parent.mkdir(parents=True)
    old.write_text("previous run")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    args = {"--data": data, "--metrics": tmp_path / "metrics"} | {flag: blocker}
    rc, _, err = run_cli(capsys, "pairs", "--model", "toy", "--params", PARAMS, *[x for kv in args.items() for x in kv])
    one_line_error(rc, err, "pairs", flag)
    assert old.read_text() == "previous run"


def test_pairs_model_name_must_stay_under_data_pairs(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "pairs", "--model", "..", "--params", PARAMS, "--data", tmp_path)
    one_line_error(rc, err, "pairs", "--model")
