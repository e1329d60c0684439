"""Bad generate.models entries for the vllm backend, and profiles that would write a params file every
stage refuses: one line naming the key, before any backend or engine is made and before anything is
written. No test here starts a vLLM engine."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from helpers import one_line_error, run_cli
from test_bad_params_generate import gen_env  # noqa: F401

import pipeline.generate as generate
from pipeline.backends import vllm_backend
from pipeline.errors import PARSError

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"


@pytest.fixture
def gen(gen_env):  # noqa: F811
    """(write(change) -> params path, argv): test_bad_params_generate's setup (smollm2's model at an
    existing dir, a prompts file, no backend), with `change` applied to smollm2's entry."""
    write_params, argv, _ = gen_env

    def write(change=None) -> Path:
        return write_params(change and (lambda data: change(data["generate"]["models"]["smollm2"])))

    return write, [*argv, "--model", "smollm2"]


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda s: s.update(model=None), "generate.models.smollm2.model None"),  # was the hub id "None"
        (lambda s: s.update(model=5), "generate.models.smollm2.model 5"),
        (lambda s: s.update(enforce_eager="no"), "generate.models.smollm2.enforce_eager 'no'"),  # bool("no")
        (lambda s: s.update(cpu_kv_cache_gib=-3), "generate.models.smollm2.cpu_kv_cache_gib -3"),
        (lambda s: s.update(cpu_kv_cache_gib="lots"), "generate.models.smollm2.cpu_kv_cache_gib 'lots'"),
        # max_model_len holds the prompt and the answer: an 8000-token answer cannot fit in 4096
        (lambda s: s.update(max_model_len=4096, max_tokens=8000), "generate.models.smollm2.max_tokens 8000"),
        (lambda s: s.update(cpu_kv_cache_gib=1.5), "generate.models.smollm2.cpu_kv_cache_gib 1.5"),  # whole GiB
        (lambda s: s.update(engine_args={"max_model_len": 8192}), "smollm2.engine_args.max_model_len: set"),
    ],
)
def test_a_bad_vllm_entry_is_one_line_before_any_backend(gen, capsys, change, named):
    write, argv = gen
    path = write(change)
    rc, _, err = run_cli(capsys, *argv)
    assert str(path) in one_line_error(rc, err, "generate", named)


def test_max_model_len_beyond_a_local_models_positions_is_refused(gen, capsys, tmp_path):
    write, argv = gen
    config = {"max_position_embeddings": 2048, "rope_parameters": {"rope_type": "default"}}
    (tmp_path / "smollm2" / "config.json").write_text(json.dumps(config))
    write(lambda s: s.update(max_model_len=4096))
    rc, _, err = run_cli(capsys, *argv)
    assert "2048 positions" in one_line_error(rc, err, "generate", "generate.models.smollm2.max_model_len 4096")
    write(lambda s: s.update(max_model_len=2048))
    # within the positions: the entry passes the checks and reaches the backend (refused by the fixture)
    rc, _, err = run_cli(capsys, *argv)
    assert "a backend was made" in err
    # a stretched rope: vLLM derives a longer limit than the config says, so it is not checked here
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (tmp_path / "smollm2" / "config.json").write_text(json.dumps(config))
    assert vllm_backend.model_max_positions(tmp_path / "smollm2") is None


def test_a_mistyped_engine_arg_is_named_before_any_backend(gen, capsys):
    pytest.importorskip("vllm")
    write, argv = gen
    write(lambda s: s.update(engine_args={"tensor_paralel_size": 2}))
    rc, _, err = run_cli(capsys, *argv)
    line = one_line_error(rc, err, "generate", "generate.models.smollm2.engine_args.tensor_paralel_size")
    assert "did you mean 'tensor_parallel_size'? Set it as " in line and line.endswith(
        ".tensor_parallel_size, beside engine_args."
    )
    write(lambda s: s.update(engine_args={"kv_cache_dtpye": "fp8"}))
    rc, _, err = run_cli(capsys, *argv)
    assert "did you mean 'kv_cache_dtype'" in one_line_error(rc, err, "generate", "engine_args.kv_cache_dtpye")
    # a real argument, of EngineArgs or of LLM(...) itself, passes
    vllm_backend.check_engine_args({"kv_cache_dtype": "fp8", "chat_template": "t"}, "m")


def test_without_vllm_engine_args_are_left_to_the_engine_start(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    vllm_backend.check_engine_args({"tensor_paralel_size": 2}, "m")


def test_a_mistyped_dataset_names_its_key(gen, capsys, monkeypatch):
    write, argv = gen
    monkeypatch.setattr(generate, "make_backend", lambda name, spec: Selecting())
    write(lambda s: s.update(datasets=["alpaca_evl"]))
    rc, _, err = run_cli(capsys, *argv)
    line = one_line_error(rc, err, "generate", "generate.models.smollm2.datasets: ['alpaca_evl']")
    assert "did you mean 'alpaca_eval'" in line


class Selecting:
    """A backend that only lets generate select its prompts."""

    def identity(self):
        raise AssertionError("the selection was not checked first")


# ---------------------------------------------------------------- profile


def _switch(capsys, tmp_path, profile: str):
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "p.yaml").write_text(profile)
    rc, _, err = run_cli(capsys, "profile", tmp_path / "p.yaml", "--params", tmp_path / "params.yaml")
    return rc, err


@pytest.mark.parametrize(
    "profile, named",
    [
        ("train: {lrr: 0.5}\n", "train.lrr: not a setting here (did you mean 'lr'?"),
        ("train: {lr: -1}\n", "train.lr -1.0: must be positive"),
        ("train: {epochs: -3}\n", "train.epochs -3: must be at least 1"),
        ("_replace: [generate.models]\ngenerate: {models: llama}\n", "generate.models: must be a mapping"),
        ("generate: {models: {smollm2: {enforce_eager: 'no'}}}\n", "generate.models.smollm2.enforce_eager"),
        # a model with no default for a setting that decides its answers
        (
            "_replace: [generate.models]\ngenerate: {models: {m: {backend: vllm, model: org/m, k: 4, temperature: 0.7,"
            " top_p: 0.95, max_tokens: 256, dtype: auto, max_model_len: 2048}}}\n",
            "generate.models.m.seed is missing",
        ),
        ("pairs: {delta: 2}\n", "pairs.delta 2.0"),
        ("evaluate: {train_models: 5}\n", "evaluate.train_models 5: must be a list of names"),
        ("capacity: {seed: -1}\n", "capacity.seed -1"),
        ("simulate: {burst: 0}\n", "simulate.burst 0"),
        ("export: {name: ..}\n", "export.name '..'"),
        ("blend: {predictors: {recorded: pairwise}, features: tfdif}\n", "blend.features 'tfdif'"),
        # no stage function checks these sections without their data: keys and kinds
        ("prepare: {max_prompt_char: 5}\n", "prepare.max_prompt_char: not a setting here"),
        ("prepare: {max_prompt_chars: many}\n", "prepare.max_prompt_chars 'many': must be a number"),
        ("engine_fit: {requests: [1]}\n", "engine_fit.requests [1]: must be an integer"),
        ("engine_fit: {token_budget: 8}\n", "engine_fit.token_budget 8: must be at least"),
        ("engine_fit: {prompt: 16:48}\n", "engine_fit.prompt 1008: expected uniform:LO:HI (or LO:HI) with whole"),
    ],
)
def test_profile_refuses_params_a_stage_would_refuse_and_writes_nothing(capsys, tmp_path, profile, named):
    rc, err = _switch(capsys, tmp_path, profile)
    line = one_line_error(rc, err, "profile", named)
    assert f"{tmp_path / 'p.yaml'} merged into {tmp_path / 'params.yaml'}" in line
    for name in ("params.yaml", "dvc.yaml"):
        assert (tmp_path / name).read_bytes() == (ROOT / name).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dvc.yaml", "p.yaml", "params.yaml"]


def test_profile_leaves_what_asks_this_machine_to_the_stage(capsys, tmp_path, monkeypatch):
    """A profile is switched to before the models, answers and devices it names exist: a local model
    dir not made yet, a GPU this machine lacks, a hub encoder offline, a capacity model not generated."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    profile = {
        "generate": {"models": {"smollm2": {"model": "models/base/notyet", "engine_args": {"nosuch_arg": 1}}}},
        "train": {"encoder": "org/encoder-not-cached", "lightning": {"accelerator": "gpu", "devices": 8}},
        "capacity": {"model": "chatgpt"},
    }
    rc, err = _switch(capsys, tmp_path, yaml.safe_dump(profile))
    assert rc == 0, err
    merged = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert merged["train"]["lightning"]["devices"] == 8
    # and the stage itself still asks: the probes are back after the switch
    with pytest.raises(PARSError, match="no such directory"):
        generate.check_spec("smollm2", merged["generate"]["models"]["smollm2"])


def test_evaluated_predictors_name_a_list_that_is_not_one():
    from pipeline.ranking.predictors import evaluated_predictors

    for key in ("train_models", "methods", "cross_models", "blends"):
        with pytest.raises(PARSError, match=rf"evaluate\.{key} 5: must be a list of names"):
            evaluated_predictors({"train_models": ["a"], "methods": ["pairwise"], key: 5})
