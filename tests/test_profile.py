"""`pars profile`: the production profile merges into params.yaml as documented."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from pipeline.profile import apply_profile, deep_merge

ROOT = Path(__file__).resolve().parents[1]


def test_deep_merge_merges_mappings_and_replaces_listed_keys():
    base = {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "b": [1, 2]}
    over = {"a": {"y": {"q": 3}}, "b": [9]}
    assert deep_merge(base, over, set()) == {"a": {"x": 1, "y": {"p": 1, "q": 3}}, "b": [9]}
    assert deep_merge(base, over, {"a.y"}) == {"a": {"x": 1, "y": {"q": 3}}, "b": [9]}
    assert base["a"]["y"] == {"p": 1, "q": 2}  # inputs untouched


def test_production_profile_switches_every_stage(tmp_path):
    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    default = yaml.safe_load(params.read_text())
    merged = apply_profile(ROOT / "profiles" / "production.yaml", params)
    assert yaml.safe_load(params.read_text()) == merged
    assert set(merged) == set(default)  # no section lost
    models = merged["generate"]["models"]
    assert "smollm2" not in models  # replaced whole, not merged
    assert models["llama-3-1-8b"]["backend"] == "vllm" and models["gpt-4"]["backend"] == "openai"
    assert set(merged["prepare"]["sources"]) == {"alpaca", "lmsys", "math", "codealpaca"}
    assert merged["train"]["encoder"] == "bert-base-uncased" and merged["train"]["max_length"] == 128
    # every model the later stages name is generated
    for section, key in (
        ("pairs", "models"),
        ("train", "models"),
        ("evaluate", "train_models"),
        ("evaluate", "eval_models"),
    ):
        assert set(merged[section][key]) <= set(models), (section, key)
    # every cross-model set the blend and evaluate stages name is trained
    assert set(merged["blend"]["predictors"]) <= set(merged["train"]["cross_models"]) | set(models)
    assert {b.split("/")[0] for b in merged["evaluate"]["blends"]} <= set(merged["blend"]["predictors"])
    # knobs the profile does not touch keep their default
    assert merged["train"]["seed"] == default["train"]["seed"]
    assert merged["pairs"]["delta"] == default["pairs"]["delta"] == 0.2
