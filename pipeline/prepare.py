"""Stage `prepare`: load prompts from the sources in params, normalise, dedupe, id and split.

- prompt_id = sha256(dataset, normalised text)[:16]: the same prompt gets the same id on
  every machine and for every model.
- split: a hash of prompt_id against the fractions in params, so a prompt's split never
  depends on which other prompts were loaded, or on the model.
- cap: per dataset, the prompts with the smallest ids (a deterministic uniform sample).
Problems (empty, non-UTF-8, malformed, missing text, oversized, duplicate) are counted by
name per source in data/prompts/report.json and printed.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import unicodedata
from pathlib import Path

import pandas as pd

from pipeline.contracts import PROMPTS, prompts_path, write_json, write_table
from pipeline.params import load_params
from pipeline.sources import get_source

_WS = re.compile(r"\s+")


def normalise(text: str) -> str:
    """The prompt as stored: Unicode NFC, surrounding whitespace stripped."""
    return unicodedata.normalize("NFC", text).strip()


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


def load_source(name: str, options: dict, fractions: dict, max_chars: int) -> tuple[pd.DataFrame, dict]:
    options = dict(options or {})
    cap = options.pop("cap", None)
    dataset = options.pop("dataset", name)  # several entries may read one source kind
    kind = options.pop("source", name)
    counts = {"records": 0, "empty": 0, "non_utf8": 0, "malformed": 0, "missing_text": 0,
              "oversized": 0, "duplicates": 0}
    rows, seen = [], set()
    for rec in get_source(kind, **options).records():
        counts["records"] += 1
        if rec.problem:
            counts[rec.problem] = counts.get(rec.problem, 0) + 1
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
        rows.append((pid, dataset, text, rec.source_id))
    df = pd.DataFrame(rows, columns=["prompt_id", "dataset", "prompt", "source_id"])
    df = df.sort_values("prompt_id", kind="stable")
    if cap is not None:
        df = df.head(int(cap))
    df["split"] = [assign_split(p, fractions) for p in df["prompt_id"]]
    counts["kept"] = len(df)
    return df, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars prepare", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(prompts_path()))
    args = parser.parse_args(argv)
    params = load_params("prepare")
    sources = params["sources"] or {}
    if not sources:
        raise ValueError("params prepare.sources is empty: name at least one prompt source")
    fractions = params["split"]
    max_chars = int(params["max_prompt_chars"])

    frames, report = [], {}
    for name, options in sources.items():
        df, counts = load_source(name, options, fractions, max_chars)
        frames.append(df)
        report[name] = counts
        problems = {k: v for k, v in counts.items() if k not in ("records", "kept") and v}
        print(f"prepare: {name}: {counts['kept']} prompts kept of {counts['records']} records"
              + (f"; dropped {problems}" if problems else ""))
        if counts["kept"] == 0:
            raise ValueError(f"source {name!r} gave no usable prompt ({counts})")
    prompts = pd.concat(frames, ignore_index=True)
    out = Path(args.out)
    write_table(prompts, out, PROMPTS)
    report["_total"] = {"prompts": len(prompts), **prompts["split"].value_counts().to_dict()}
    write_json(report, out.parent / "report.json")
    print(f"prepare: {len(prompts)} prompts -> {out} ({report['_total']})")
    return 0
