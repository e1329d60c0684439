"""`pars profile FILE`: switch params.yaml to a profile (e.g. profiles/production.yaml).

The profile is deep-merged into params.yaml: mappings merge key by key, anything else is
replaced; a dotted key listed under the profile's `_replace` is replaced whole (e.g. the
list of generation models). Comments in params.yaml are not kept. DVC cannot build a dep list
from params, so the evaluate stage's model deps in the dvc.yaml beside params.yaml (the lines
between its BEGIN/END evaluate models comments) are rewritten from the merged `evaluate` section.
The merged params are checked first, by the checks the stages run on their sections (check_merged):
a profile that would write a params file some stage refuses is refused, and nothing is written.
Before the first switch each file is copied to `<file>.pre-profile` (uncommitted edits and
comments included; a later switch keeps that copy); `cp params.yaml.pre-profile params.yaml` (and
the same for dvc.yaml) goes back. A backup is never overwritten by a different file: if
params.yaml was not written by `pars profile` and its backup differs, the switch is refused until
the old backup is moved away (it may hold the only copy of edits never committed).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import PARSError
from pipeline.params import Section, as_section, existing_params_path, params_path, read_yaml
from pipeline.ranking.predictors import evaluated_predictors, names


def deep_merge(base: dict, overlay: dict, replace: set[str], prefix: str = "") -> dict:
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(out.get(key), dict) and dotted not in replace:
            out[key] = deep_merge(out[key], value, replace, dotted + ".")
        else:
            out[key] = copy.deepcopy(value)
    return out


def _names(overlay: dict, dotted: str) -> bool:
    """Whether the dotted key (`generate.models`) is a key of the profile."""
    node: Any = overlay
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def check_profile(profile: Path, overlay: Any, base: Any, params: Path) -> set[str]:
    """The profile's sections against the params file it merges into; returns its _replace keys.
    A misspelled section (`trian:`) or a section that is not a mapping (`train: 5`) would write a
    params.yaml that every stage then refuses, or silently ignores."""
    if not isinstance(overlay, dict):
        raise PARSError(f"{profile}: must be a mapping of params sections, not {type(overlay).__name__}")
    if not isinstance(base, dict):
        raise PARSError(f"{params}: must be a mapping of stage sections, not {type(base).__name__}")
    replace = overlay.get("_replace") or []
    if not isinstance(replace, list) or not all(isinstance(k, str) for k in replace):
        raise PARSError(f"{profile}: _replace {replace!r}: must be a list of dotted keys (e.g. generate.models)")
    for key in replace:
        if not _names(overlay, key):
            raise PARSError(f"{profile}: _replace names {key!r}, which is not a key of the profile")
    for section, value in overlay.items():
        if section == "_replace":
            continue
        if section not in base:
            raise PARSError(
                f"{profile}: unknown section {section!r}: {params} has no such section "
                f"(sections: {', '.join(map(str, base))})"
            )
        if value is not None and not isinstance(value, dict):
            raise PARSError(f"{profile}: {section} must be a mapping of keys to values, not {value!r}")
    return set(replace)


def check_merged(merged: dict, base: dict, where: str) -> None:
    """Every section of the merged params as its stage checks it, before anything is written: a
    profile's `lrr`, `lr: -1` or `models: llama` would otherwise write a params file that the stage
    refuses only when it runs. Only what the params decide (machine=False). Sections whose stage
    checks its params only with its data (prepare, sim_fidelity) get _like_base, and each entry of
    prepare.sources prepare's own check (source_options, without the files this machine has)."""
    from pipeline import blend, capacity, engine_fit, evaluate, export, generate, pairs, prepare, simulate, train
    from pipeline.ranking.losses import METHODS

    # machine=False: what a check would ask this machine (the hub, its accelerator, files that later
    # stages write) is left out; a profile is switched to before those exist, often elsewhere
    checks = {
        "generate": lambda sec: generate.check_params(sec, machine=False),
        "pairs": pairs.check_params,
        # train@<model> trains every method; with no per-model predictors only train_cross's pairwise
        "train": lambda sec: train.check_params(
            sec, list(METHODS) if sec.get("models") else ["pairwise"], machine=False
        ),
        # one blend@<model> stage per entry of predictors, each checking the section for its entry
        "blend": lambda sec: [blend.check_params(model, sec, machine=False) for model in sec.mapping("predictors")],
        "evaluate": lambda sec: (evaluate.check_params(sec, machine=False), evaluated_predictors(sec)),
        "export": export.check_params,
        "capacity": lambda sec: capacity.check_stage_params(sec, machine=False),
        "simulate": lambda sec: simulate.check_params(sec, sec.where),
        "engine_fit": engine_fit.check_section,
    }
    for name, value in merged.items():
        if value is not None and not isinstance(value, dict):
            raise PARSError(f"{where}: {name} must be a mapping of keys to values, not {value!r}")
        section = as_section(value or {}, f"{where}: {name}")
        if name in checks:
            checks[name](section)
        elif name in ("prepare", "sim_fidelity") and isinstance(base.get(name), dict):
            _like_base(section, base[name])
        if name == "prepare" and isinstance(section.get("sources"), dict):  # each entry as the stage checks it
            for source, options in section["sources"].items():
                prepare.source_options(source, options, f"{section.where}.sources.{source}", machine=False)
        # materialize: its keys are model names; the stage checks each entry before converting any


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    kinds = ((int, "a number"), (float, "a number"), (str, "a string"), (list, "a list"), (dict, "a mapping"))
    return next((kind for cls, kind in kinds if isinstance(value, cls)), "null" if value is None else "other")


def _like_base(section: Section, base: dict) -> None:
    """A section whose stage checks it only with its data: at least no key the params file's section
    lacks, and no value of another kind (number, string, list, mapping) than the file's."""
    section.only(base)
    for key, was in base.items():
        if key in section and was is not None and _kind(section[key]) != _kind(was):
            raise PARSError(f"{section.where}.{key} {section[key]!r}: must be {_kind(was)}, as in the params file")


BEGIN_EVALUATE_MODELS = "# BEGIN evaluate models"
END_EVALUATE_MODELS = "# END evaluate models"


def evaluate_model_deps(evaluate: dict[str, Any]) -> list[str]:
    """The paths the evaluate stage reads for params `evaluate`: each eval model's generations, then
    each predictor's checkpoint, in the order the stage scores them."""
    deps = [f"data/generations/{m}" for m in names(evaluate, "eval_models")]
    deps += [f"models/{m}/{method}" for m, method in evaluated_predictors(evaluate)]
    return list(dict.fromkeys(deps))


def with_evaluate_deps(dvc_text: str, deps: list[str], where: Path) -> str:
    """dvc.yaml's text with the lines between the evaluate-models markers replaced by `deps`; the
    result must parse with exactly those paths among the evaluate stage's deps, or nothing is written."""
    lines = dvc_text.splitlines(keepends=True)
    begin = [i for i, line in enumerate(lines) if line.strip().startswith(BEGIN_EVALUATE_MODELS)]
    end = [i for i, line in enumerate(lines) if line.strip() == END_EVALUATE_MODELS]
    if len(begin) != 1 or len(end) != 1 or end[0] < begin[0]:
        raise PARSError(
            f"{where}: the evaluate stage's deps need one `{BEGIN_EVALUATE_MODELS} ...` line and one "
            f"`{END_EVALUATE_MODELS}` line after it (pars profile writes the model deps between them)"
        )
    b = lines[begin[0]]
    indent = b[: len(b) - len(b.lstrip())]
    newline = "\r\n" if b.endswith("\r\n") else "\n"
    text = "".join(lines[: begin[0] + 1] + [f"{indent}- {json.dumps(d)}{newline}" for d in deps] + lines[end[0] :])
    try:
        stage_deps = yaml.safe_load(text)["stages"]["evaluate"]["deps"]
    except (yaml.YAMLError, KeyError, TypeError):
        stage_deps = None
    if not isinstance(stage_deps, list) or [d for d in stage_deps if d in deps] != deps:
        raise PARSError(f"{where}: the evaluate-models markers are not inside stages.evaluate.deps; nothing written")
    return text


def _read_keeping_newlines(path: Path) -> str:
    with path.open(encoding="utf-8", newline="") as fh:  # a CRLF file stays CRLF
        return fh.read()


BACKUP = ".pre-profile"  # params.yaml.pre-profile: the file as it was before `pars profile`
GENERATED = "# generated by `pars profile"  # the first line of a params file it wrote


def apply_profile(profile: str | Path, params: str | Path = "params.yaml") -> dict[str, Any]:
    profile, params = Path(profile), Path(params)
    if not profile.is_file():
        raise FileNotFoundError(f"profile {profile} does not exist")
    if not params.is_file():  # merging into nothing would write a params file holding only the profile
        raise FileNotFoundError(f"params file {params} does not exist (give the one to switch with --params)")
    overlay = read_yaml(profile) or {}
    base = read_yaml(params) or {}
    replace = check_profile(profile, overlay, base, params)
    # a blank section (`train:`) changes nothing; under _replace it empties the section
    overlay = {k: {} if v is None else v for k, v in overlay.items() if k != "_replace"}
    merged = deep_merge(base, overlay, replace)
    check_merged(merged, base, f"{profile} merged into {params}")
    dvc_yaml = params.with_name("dvc.yaml")  # a params file outside a DVC project has none
    dvc_text = None
    if dvc_yaml.is_file():  # checked before either file is written
        dvc_text = with_evaluate_deps(
            _read_keeping_newlines(dvc_yaml), evaluate_model_deps(merged.get("evaluate") or {}), dvc_yaml
        )
    # restoring from the backups, not `git checkout`: that would drop uncommitted edits whose only
    # copy is then the backup
    restore = " and ".join(f"`cp {p}{BACKUP} {p}`" for p in [params] + ([dvc_yaml] if dvc_text else []))
    params_text = (
        f"{GENERATED} {profile}`; {params}{BACKUP} holds the file as it was before the first switch "
        f"(to go back: {restore})\n" + yaml.safe_dump(merged, sort_keys=False, allow_unicode=True)
    )
    # each file as it was before the first switch (comments and edits not yet committed included; a
    # second switch keeps that backup, not the generated file), then the new one whole via a temp
    # file and a rename: an interrupted switch leaves no half-written file
    writes = [(params, params_text)] + ([(dvc_yaml, dvc_text)] if dvc_text is not None else [])
    switched_before = _read_keeping_newlines(params).startswith(GENERATED)
    backups = []  # (file, its backup) to write; every backup checked before anything is written
    for path, _ in writes:
        backup = path.with_name(path.name + BACKUP)
        if backup.exists() and switched_before:
            continue  # `path` is the generated file: the backup is what a user goes back to
        if backup.exists() and backup.read_bytes() != path.read_bytes():
            # backing up `path` would lose the older backup, maybe the only copy of uncommitted edits
            raise PARSError(
                f"{backup} exists and differs from {path}; backing up {path} would overwrite it: "
                f"move {backup} away first"
            )
        backups.append((path, backup))
    temps = [path.with_name(f".{path.name}.tmp") for path, _ in writes]
    try:
        for path, backup in backups:
            backup.write_bytes(path.read_bytes())
        for (_, text), tmp in zip(writes, temps):
            with tmp.open("w", encoding="utf-8", newline="") as fh:
                fh.write(text)
        for (path, _), tmp in zip(writes, temps):
            os.replace(tmp, path)
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars profile", description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a YAML file of params overrides, e.g. profiles/production.yaml")
    parser.add_argument("--params", default=None, help="params file to switch (default params.yaml, or $PARS_PARAMS)")
    args = parser.parse_args(argv)
    # the file the other commands read (pipeline.params.load_params): switch that one
    # a --params given is apply_profile's to check (its line says what to give); the default or
    # $PARS_PARAMS the shared check's, which names a stale variable
    params = str(params_path(args.params) if args.params else existing_params_path())
    merged = apply_profile(args.profile, params)
    dvc_yaml = Path(params).with_name("dvc.yaml")
    also = f"; evaluate's model deps in {dvc_yaml} follow it" if dvc_yaml.is_file() else ""
    print(f"profile: {args.profile} merged into {params} (sections: {', '.join(merged)}){also}")
    print(
        f"profile: the files as they were before the first switch are kept as {params}{BACKUP}"
        + (f" and {dvc_yaml}{BACKUP}" if also else "")
    )
    return 0
