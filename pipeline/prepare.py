"""Stage `prepare`: load prompts from the sources in params, normalise, dedupe, id and split.

- prompt_id = sha256(dataset, normalised text)[:16]: the same prompt gets the same id on
  every machine and for every model.
- split: a hash of prompt_id against the fractions in params, so a prompt's split never
  depends on which other prompts were loaded, or on the model.
- cap: per dataset, the prompts with the smallest ids (a deterministic uniform sample).
- a source may tie a prompt's split to a shared key (every part and later turn of one ShareGPT
  conversation takes that conversation's split); `splits: [train]` keeps only prompts of those splits.
Problems (empty, non-UTF-8, malformed, missing text, oversized, duplicate) are counted by
name per source in data/prompts/report.json and printed.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.contracts import PROMPTS, ensure_parent, prompts_path, write_json, write_table
from pipeline.errors import PARSError
from pipeline.params import PARAMS_HELP, load_params
from pipeline.sources import SOURCES, get_source
from pipeline.sources.base import SourceUnavailable, normalise

_WS = re.compile(r"\s+")


def prompt_id(dataset: str, text: str) -> str:
    """Stable id: whitespace differences and case do not make a new prompt."""
    key = _WS.sub(" ", normalise(text)).lower()
    return hashlib.sha256(f"{dataset}\x00{key}".encode()).hexdigest()[:16]


def assign_split(pid: str, fractions: dict[str, float]) -> str:
    """train/val/test from a hash of the id (independent of the other prompts)."""
    total = sum(fractions.values())
    if total <= 0:
        raise ValueError(f"split fractions must sum to a positive number, got {fractions}")
    u = int(hashlib.sha256(f"split\x00{pid}".encode()).hexdigest()[:12], 16) / float(1 << 48)
    edge = 0.0
    for name in ("train", "val", "test"):
        edge += fractions.get(name, 0.0) / total
        if u < edge:
            return name
    return "test"


# options every entry of prepare.sources takes, whatever its source
COMMON_OPTIONS = ("cap", "dataset", "source", "splits")


def source_options(name: str, options: Any, where: str, machine: bool = True) -> tuple[str, dict]:
    """(source kind, options for it) of a prepare.sources entry, or one line naming the entry and
    what is wrong: an unknown source or option (a misspelling), a missing one, a cap or limit that is
    not a count, a dataset name that is not a string; with `machine`, a jsonl file this machine lacks
    (`pars profile` checks without: the file may live where the pipeline runs).

    `{mine: {path: prompts.jsonl}}` is a file of the user's own (the `jsonl` source)."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise PARSError(f"{where}: expected a mapping of options (e.g. {{cap: 100}}), got {options!r}")
    options = dict(options)
    kind = options.get("source") or ("jsonl" if name not in SOURCES and "path" in options else name)
    if not isinstance(kind, str):
        raise PARSError(f"{where}: source {kind!r} is not a source name")
    if kind not in SOURCES:
        raise PARSError(
            f"{where}: unknown source {kind!r} (known: {', '.join(sorted(SOURCES))}; "
            f"a prompt file of your own: {{path: prompts.jsonl}})"
        )
    params = inspect.signature(SOURCES[kind].__init__).parameters
    takes = [n for n in params if n != "self" and params[n].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    for option in options:
        if option not in COMMON_OPTIONS and option not in takes:
            raise PARSError(f"{where}: unknown option {option!r} (known: {', '.join([*COMMON_OPTIONS, *takes])})")
    for option in takes:
        if params[option].default is inspect.Parameter.empty and option not in options:
            raise PARSError(f"{where}: the {kind} source needs option {option!r}")
    cap = options.get("cap")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
        raise PARSError(f"{where}: cap {cap!r} is not a number of prompts (a whole number >= 0, or null for all)")
    dataset = options.get("dataset", name)
    if not isinstance(dataset, str) or not dataset:
        raise PARSError(f"{where}.dataset {dataset!r}: must be a non-empty string (the dataset's name in the prompts)")
    # the hub sources' records to stream: 0 would be falsy, i.e. the whole dataset
    limit = options.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise PARSError(f"{where}.limit {limit!r}: must be a whole number >= 1, or null for all")
    splits = options.get("splits")
    if splits is not None and (
        not isinstance(splits, list)
        or not splits
        or not all(isinstance(s, str) for s in splits)
        or not set(splits) <= {"train", "val", "test"}
    ):
        raise PARSError(f"{where}: splits {splits!r} is not a list of train, val, test (or null for all)")
    for option in takes:  # the source's own options other than limit (path, text_field, repo) are strings
        value, default = options.get(option, params[option].default), params[option].default
        if option == "limit" or (value is None and default is None):
            continue
        if not isinstance(value, str) or not value:
            raise PARSError(f"{where}.{option} {value!r}: must be a non-empty string")
    if kind == "jsonl" and machine:  # found now, before any entry is loaded
        path = Path(options["path"])
        if path.is_dir():
            raise PARSError(f"{where}.path {path}: is a directory, not a JSONL file of prompts")
        if not path.is_file():
            raise PARSError(f"{where}.path {path}: does not exist")
    return kind, options


def _records(source, where: str):
    """The source's records; a source that cannot be read (package missing, file unparsable, hub
    unreachable) is one line naming its params entry."""
    try:
        yield from source.records()
    except (SourceUnavailable, ValueError) as exc:
        raise PARSError(f"{where}: {exc}") from None


def load_source(
    name: str, options: dict, fractions: dict, max_chars: int, where: str | None = None
) -> tuple[pd.DataFrame, dict]:
    where = where or f"prepare.sources.{name}"
    kind, options = source_options(name, options, where)
    cap = options.pop("cap", None)
    keep_splits = options.pop("splits", None)
    dataset = options.pop("dataset", name)  # several entries may read one source kind
    options.pop("source", None)
    counts = {
        "records": 0,
        "empty": 0,
        "non_utf8": 0,
        "malformed": 0,
        "missing_text": 0,
        "oversized": 0,
        "duplicates": 0,
    }
    rows, seen, first_at = [], set(), {}
    for rec in _records(get_source(kind, **options), where):
        counts["records"] += 1
        if rec.problem:
            counts[rec.problem] = counts.get(rec.problem, 0) + 1
            if rec.where:
                first_at.setdefault(rec.problem, rec.where)
            continue
        text = normalise(rec.prompt)
        if not text:
            counts["empty"] += 1
            continue
        if len(text) > max_chars:
            counts["oversized"] += 1
            continue
        pid = prompt_id(dataset, text)
        if pid in seen:
            counts["duplicates"] += 1
            continue
        seen.add(pid)
        split_id = prompt_id(rec.split_with[0], rec.split_with[1]) if rec.split_with else pid
        rows.append((pid, dataset, text, rec.source_id, assign_split(split_id, fractions)))
    df = pd.DataFrame(rows, columns=["prompt_id", "dataset", "prompt", "source_id", "split"])
    if keep_splits is not None:
        counts["other_split"] = int((~df["split"].isin(keep_splits)).sum())
        df = df[df["split"].isin(keep_splits)]
    df = df.sort_values("prompt_id", kind="stable")
    if cap is not None:
        df = df.head(int(cap))
    df = df[["prompt_id", "dataset", "prompt", "split", "source_id"]]
    counts["kept"] = len(df)
    if first_at:  # a user's file: where to look, not only how many
        counts["first_at"] = first_at
    return df, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars prepare", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        default=str(prompts_path()),
        help="the prompts table to write (default %(default)s); report.json in the same directory is replaced too",
    )
    parser.add_argument("--params", default=None, help=PARAMS_HELP)
    args = parser.parse_args(argv)
    params = load_params("prepare", args.params).only(("sources", "split", "max_prompt_chars"))
    ensure_parent(args.out)  # an --out under a file fails now, not after reading every source
    sources = params["sources"] or {}
    if not sources:
        raise PARSError(f"{params.where}.sources is empty: name at least one prompt source")
    if not isinstance(sources, dict):
        raise PARSError(f"{params.where}.sources: expected a mapping of source name to options")
    for name, options in sources.items():  # every entry's name, options and file, before any is loaded
        source_options(name, options, f"{params.where}.sources.{name}")
    fractions = params["split"]
    if (
        not isinstance(fractions, dict)
        or set(fractions) - {"train", "val", "test"}
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in fractions.values())
    ):
        raise PARSError(
            f"{params.where}.split: expected {{train: F, val: F, test: F}} with fractions from 0 to 1, "
            f"got {fractions!r}"
        )
    if abs(sum(fractions.values()) - 1) > 1e-6:  # not rescaled: a typo would silently move prompts
        raise PARSError(
            f"{params.where}.split {fractions!r}: the fractions must sum to 1, not {sum(fractions.values()):g}"
        )
    empty = [name for name in ("train", "val", "test") if not fractions.get(name)]
    if empty:  # found here, not by pairs or train as an empty split far from the cause
        raise PARSError(
            f"{params.where}.split {fractions!r}: {' and '.join(empty)} need a share > 0 (train learns on train, "
            "picks its best epoch on val; evaluate scores test)"
        )
    max_chars = params["max_prompt_chars"]
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise PARSError(f"{params.where}.max_prompt_chars {max_chars!r}: expected a whole number >= 1")

    frames, report = [], {}
    for name, options in sources.items():
        df, counts = load_source(name, options, fractions, max_chars, where=f"{params.where}.sources.{name}")
        frames.append(df)
        report[name] = counts
        problems = {k: v for k, v in counts.items() if k not in ("records", "kept", "first_at") and v}
        first_at = counts.get("first_at", {})
        print(
            f"prepare: {name}: {counts['kept']} prompts kept of {counts['records']} records"
            + (f"; dropped {problems}" if problems else "")
            + (f" (first: {', '.join(f'{k} at {w}' for k, w in first_at.items())})" if first_at else "")
        )
        if counts["kept"] == 0:
            raise PARSError(f"{params.where}.sources.{name}: gave no usable prompt ({counts})")
    prompts = pd.concat(frames, ignore_index=True)
    # two entries that name one dataset (option `dataset`) may hold the same text: one id twice, which
    # generate would answer twice and pairs refuse far from the cause, or which could sit in two splits
    repeated = prompts["prompt_id"].duplicated(keep=False).to_numpy()
    if repeated.any():
        entry = np.repeat(list(sources), [len(df) for df in frames])  # each row's entry
        first = prompts["prompt_id"][repeated].iloc[0]
        both = sorted(set(entry[(prompts["prompt_id"] == first).to_numpy()]))
        raise PARSError(
            f"{params.where}.sources: {int(repeated.sum())} rows share a prompt id across entries of one dataset "
            f"(e.g. {first} in {' and '.join(both)}); give each entry its own `dataset` name"
        )
    out = Path(args.out)
    write_table(prompts, out, PROMPTS)
    report["_total"] = {"prompts": len(prompts), **prompts["split"].value_counts().to_dict()}
    write_json(report, out.parent / "report.json")
    print(f"prepare: {len(prompts)} prompts -> {out} ({report['_total']})")
    return 0
