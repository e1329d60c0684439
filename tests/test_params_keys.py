"""A mistyped params key (set in params.yaml, by a profile or `dvc exp run -S`) stops its stage in
one line naming it: ignored, the default it meant to change would run without a word."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from pipeline.errors import PARSError
from pipeline.params import Section, load_params


def _checks():
    from pipeline import blend, capacity, evaluate, export, pairs, sim_fidelity, simulate, train

    return {
        "train": lambda p: train.check_params(p, ["pairwise"]),
        "pairs": pairs.check_params,
        "evaluate": evaluate.check_params,
        "export": export.check_params,
        "capacity": capacity.check_stage_params,
        "simulate": lambda p: simulate.check_params(p, p.where),
        "blend": lambda p: blend.check_params("recorded", {**p, "predictors": {"recorded": "pairwise"}}),
        "sim_fidelity": sim_fidelity.run,
    }


# (section, path to the mapping that gets the stray key, the stray key)
CASES = [
    ("train", (), "lrr"),
    ("train", ("lightning",), "acelerator"),
    ("train", ("lexical_prior",), "ngram"),
    ("train", ("wandb",), "projct"),
    ("pairs", (), "detla"),
    ("evaluate", (), "eval_model"),
    ("evaluate", ("bootstrap",), "seeds"),
    ("evaluate", ("tfidf_ridge",), "alpha"),
    ("export", (), "methods"),
    ("capacity", (), "step_times"),
    ("simulate", (), "bursts"),
    ("simulate", ("engine",), "max_num_seq"),
    ("simulate", ("workloads", "chatgpt"), "score_models"),
    ("simulate", ("quality_curve",), "sigma"),
    ("blend", (), "feature"),
    ("sim_fidelity", (), "calibrate"),
]


@pytest.mark.parametrize("section,path,key", CASES)
def test_a_mistyped_key_is_refused_naming_it(section, path, key):
    params = load_params(section)
    bad = copy.deepcopy(dict(params))
    target = bad
    for part in path:
        target[part] = dict(target[part])
        target = target[part]
    target[key] = 1
    with pytest.raises(PARSError) as exc:
        _checks()[section](Section(bad, params.where) if section != "blend" else bad)
    line = str(exc.value)
    assert "\n" not in line and f".{key}: not a setting here" in line
    assert ".".join((section, *path, key)) in line.replace("params: ", "").replace("params.yaml: ", "")


def test_blend_decoder_settings_refuse_a_mistyped_key():
    from pipeline import blend

    decoder = {**load_params("blend")["decoder"], "layer": 3}
    with pytest.raises(PARSError, match=r"blend\.decoder\.layer: not a setting here \(did you mean 'layers'"):
        blend.decoder_settings(decoder, "params.yaml: blend.decoder")


@pytest.mark.parametrize(
    "stage,argv,key", [("generate", ["--model", "chatgpt"], "recorded_tokeniser"), ("prepare", [], "max_prompt_char")]
)
def test_generate_and_prepare_refuse_a_mistyped_key(tmp_path, monkeypatch, stage, argv, key):
    import importlib

    import yaml

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text(encoding="utf-8"))
    params[stage][key] = 1
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params), encoding="utf-8")
    monkeypatch.setenv("PARS_PARAMS", str(path))
    with pytest.raises(PARSError, match=rf"{stage}\.{key}: not a setting here"):
        importlib.import_module(f"pipeline.{stage}").main(
            [*argv, "--out" if stage == "prepare" else "--out-root", str(tmp_path / "out")]
        )


def test_the_suggestion_names_the_closest_key():
    with pytest.raises(PARSError, match=r"train\.lrr: not a setting here \(did you mean 'lr'\?"):
        Section({"lr": 1, "lrr": 2}, "train").only(("lr", "epochs"))
    assert Section({"lr": 1}, "train").only(("lr",)) == {"lr": 1}


@pytest.mark.parametrize(
    "change, match",
    [
        ({"cross_models": {"recorded": "chatgpt"}}, r"cross_models\.recorded 'chatgpt': must be a non-empty list"),
        ({"cross_models": {"recorded": ["chatgpt", "chatgpt"]}}, r"cross_models\.recorded .*distinct model names"),
        ({"cross_models": {"chatgpt": ["chatgpt", "o3-mini"]}}, r"cross_models\.chatgpt: 'chatgpt' is also in"),
        ({"lightning": {"precision": "16-mixed"}}, r"precision '16-mixed': mixed float16 needs a GPU"),
    ],
)
def test_train_refuses_settings_that_would_silently_train_something_else(change, match):
    import torch

    from pipeline import train

    if "lightning" in change and (torch.cuda.is_available() or torch.backends.mps.is_available()):
        pytest.skip("float16 is refused on a CPU only")
    params = load_params("train")
    bad = {**copy.deepcopy(dict(params)), **change}
    if "lightning" in change:
        bad["lightning"] = {**params["lightning"], **change["lightning"]}
    with pytest.raises(PARSError, match=match):
        train.check_params(Section(bad, params.where), ["pairwise"])


# keys a stage reads but dvc.yaml leaves out on purpose (they change no output; dvc.yaml says why)
LEFT_OUT_OF_DVC = {
    "train": {"torch_threads", "num_workers", "wandb", "cross_models", "models"},
    "evaluate": {"torch_threads", "wandb"},
}


@pytest.mark.parametrize("stage,section", [("train", "train"), ("evaluate", "evaluate")])
def test_a_stage_that_lists_its_params_key_by_key_declares_every_other_key(stage, section):
    """A key added to params.yaml but not to the stage's dvc.yaml params would change the stage's
    output without DVC rerunning it."""
    import yaml

    root = Path(__file__).resolve().parents[1]
    spec = yaml.safe_load((root / "dvc.yaml").read_text())["stages"][stage]
    declared = {str(p).split(".", 1)[1] for p in spec.get("do", spec)["params"]}
    keys = set(yaml.safe_load((root / "params.yaml").read_text())[section])
    assert keys - declared - LEFT_OUT_OF_DVC[stage] == set()
    assert declared <= keys


def test_real_dvc_reads_the_pipeline_and_the_production_profile(tmp_path):
    """DVC itself (not a YAML parser) must accept dvc.yaml with params.yaml, before and after `pars
    profile` switches to the production profile: the stage list and the graph resolve."""
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(root / name, tmp_path / name)
    dvc = [sys.executable, "-m", "dvc"]

    def run(*args):
        out = subprocess.run([*dvc, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    run("init", "--no-scm", "-q")
    default = run("stage", "list", "--name-only").split()
    assert {"prepare", "train@chatgpt", "train_cross@recorded", "evaluate", "export", "simulate"} <= set(default)
    assert "train@chatgpt" in run("dag", "evaluate")
    from pipeline.profile import apply_profile

    apply_profile(root / "profiles" / "production.yaml", tmp_path / "params.yaml")
    production = set(run("stage", "list", "--name-only").split())
    assert {"train@r1-distill-llama-8b", "train_cross@all", "evaluate"} <= production
    assert "train@chatgpt" not in production
    assert "train_cross@all" in run("dag", "evaluate")  # the rewritten evaluate deps resolve in DVC's graph
