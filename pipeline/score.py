"""score: `pars score --checkpoint DIR INPUT [-o OUT]` scores a JSONL or parquet file of prompts.

Input: JSONL (one JSON object a line, blank lines skipped) or parquet, the prompt in `--field`
(default `prompt`). Output: one row per input record, in input order: `index` (0-based record
number), the record's id (`--id-field`, default `prompt_id` or `id` when present) and `score`
(higher = longer answer expected), as JSONL (stdout or .jsonl) or parquet (.parquet).
Bad input (not UTF-8, malformed JSON, a missing or non-text field) stops with an error naming the
file and line (JSONL) or row (parquet).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.contracts import ensure_parent, same_file, write_table, write_text
from pipeline.errors import PARSError

ID_FIELDS = ("prompt_id", "id")


def read_jsonl(path: Path, field: str, id_field: str | None = None) -> list[dict]:
    records = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a leading byte-order mark is no text
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: malformed JSON ({exc.msg}, column {exc.colno})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            _check_text(record, field, f"{path}:{lineno}")
            _check_id(record, id_field, f"{path}:{lineno}")
            records.append(record)
    return records


def read_parquet(path: Path, field: str, id_field: str | None = None) -> list[dict]:
    try:
        table = pq.read_table(path)
        df = table.to_pandas()
    except Exception as exc:  # pyarrow raises several types (including on invalid UTF-8)
        raise ValueError(f"{path}: not a readable parquet file ({exc})") from None
    if field not in df.columns:
        raise ValueError(f"{path}: no column {field!r} (columns: {list(df.columns)}); choose one with --field")
    if id_field is not None and id_field not in df.columns:
        raise ValueError(f"{path}: no column {id_field!r} (columns: {list(df.columns)}); choose one with --id-field")
    records = df.to_dict("records")
    for row, record in enumerate(records):
        _check_text(record, field, f"{path}: row {row}")
    # ids as stored: pandas reads an integer column with a null as float64 (3 -> 3.0, 2**60 + 1 rounded)
    for name in ({id_field, *ID_FIELDS} & set(df.columns)) - {field}:
        for row, (record, value) in enumerate(zip(records, table.column(name).to_pylist())):
            record[name] = value
            _check_finite_id(name, value, f"{path}: row {row}")
    return records


def _check_id(record: dict, id_field: str | None, where: str) -> None:
    """An --id-field the record lacks would be written as a null id: refused, naming the record."""
    if id_field is not None and id_field not in record:
        raise ValueError(f"{where}: no id field {id_field!r} (fields: {sorted(record)}); choose one with --id-field")
    for name in {id_field, *ID_FIELDS} & set(record):
        _check_finite_id(name, record[name], where)


def _check_finite_id(name: str, value, where: str) -> None:
    """An id of NaN or inf (JSON NaN, 1e400) is written as null: refused, naming the record."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: id {name!r} is {value!r}, not a finite number (it would be written as null)")


def _check_text(record: dict, field: str, where: str) -> None:
    if field not in record:
        raise ValueError(f"{where}: missing text field {field!r} (fields: {sorted(record)}); choose one with --field")
    value = record[field]
    if value is None or (isinstance(value, float) and value != value):  # JSON null, parquet null (NaN)
        raise ValueError(f"{where}: field {field!r} is null, not text")
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {field!r} is {type(value).__name__}, not text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # JSON can escape a lone surrogate (\ud800); no tokenizer takes it
        raise ValueError(
            f"{where}: field {field!r} holds {exc.object[exc.start:exc.end]!r}, not text " f"(a lone UTF-16 surrogate)"
        ) from None


def read_prompts(path: str | Path, field: str = "prompt", id_field: str | None = None) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is a directory, not a file" if path.is_dir() else f"{path} does not exist")
    if path.suffix == ".parquet":
        return read_parquet(path, field, id_field)
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        return read_jsonl(path, field, id_field)
    raise ValueError(f"{path}: unknown input format {path.suffix!r} (expected .jsonl or .parquet)")


def _check_parquet_ids(ids: pd.Series, id_field: str, source: str) -> None:
    """A parquet column holds one type: ids mixing text and numbers (or too large for int64) are
    refused naming the input, before scoring (pyarrow would fail after it, naming no file)."""
    try:
        pa.array(ids, from_pandas=True)
    except (pa.ArrowException, OverflowError):
        kinds = ", ".join(sorted({type(v).__name__ for v in ids if v is not None}))
        raise PARSError(
            f"{source}: the ids in {id_field!r} ({kinds}) do not fit one parquet column (text and numbers "
            f"mixed, or an integer past int64); write -o as .jsonl, which keeps each id as it is"
        ) from None


def _positive_int(text: str) -> int:
    """argparse type: a batch size of 0 or less would score nothing (or garbage) silently."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    from pipeline.serving.scorer import Scorer

    parser = argparse.ArgumentParser(prog="pars score", description=__doc__.split("\n")[0])
    parser.add_argument("input", help="JSONL or parquet file of prompts")
    parser.add_argument(
        "--checkpoint", required=True, help="exported checkpoint dir (e.g. models/export/pars-recorded)"
    )
    parser.add_argument("-o", "--output", help="write .jsonl or .parquet here (default: JSONL to stdout)")
    parser.add_argument("--field", default="prompt", help="the prompt's field/column (default: %(default)s)")
    parser.add_argument("--id-field", help=f"id to carry to the output (default: the first of {ID_FIELDS} present)")
    parser.add_argument(
        "--batch-size", type=_positive_int, default=32, help="prompts per forward pass (default: %(default)s)"
    )
    args = parser.parse_args(argv)

    if args.output and same_file(args.output, args.input):
        raise PARSError(f"-o {args.output}: is the input file {args.input}; the scores would replace the prompts")
    records = read_prompts(args.input, args.field, args.id_field)  # input errors before the (slower) model load
    if args.output:
        if Path(args.output).suffix not in (".jsonl", ".parquet"):
            raise PARSError(f"-o {args.output}: output must end in .jsonl or .parquet")
        ensure_parent(args.output)  # a file in the way is found before scoring, not after
    id_field = args.id_field or next((f for f in ID_FIELDS if records and all(f in r for r in records)), None)
    # object dtype: pandas would turn integer ids with a null into float64 (3 -> 3.0, 2**60 + 1 rounded)
    ids = pd.Series([r.get(id_field) for r in records], dtype=object) if id_field else None
    if ids is not None and args.output and args.output.endswith(".parquet"):
        _check_parquet_ids(ids, id_field, args.input)  # found before scoring, not when writing
    scorer = Scorer.from_pretrained(args.checkpoint, batch_size=args.batch_size)  # CheckpointError: one line
    scores = scorer.score([r[args.field] for r in records], progress=len(records) > 256)
    bad = int((~np.isfinite(scores)).sum())
    if bad:  # each would be written as "score": null (export refuses such a checkpoint; train may not)
        raise PARSError(
            f"--checkpoint {args.checkpoint}: non-finite scores for {bad} of {len(records)} prompts of "
            f"{args.input}; the checkpoint is broken (nothing written)"
        )
    partial = [f for f in ID_FIELDS if not id_field and any(f in r for r in records)]
    if partial:  # the output's `index` still ties each score to its input record
        having = sum(partial[0] in r for r in records)
        print(
            f"score: {partial[0]!r} is in {having} of {len(records)} records only: no id column written "
            f"(--id-field {partial[0]} requires it in every record)",
            file=sys.stderr,
        )
    out = pd.DataFrame({"index": range(len(records))})
    if id_field:
        out[id_field] = ids
    out["score"] = scores.astype(float)
    # written via a temp file + rename: an interrupted run leaves the old output (or none), never half a file
    if args.output and args.output.endswith(".parquet"):
        write_table(out, args.output, pa.Schema.from_pandas(out, preserve_index=False))
    else:
        # no records: no lines (pandas would write one empty line, which is not a JSONL record);
        # ASCII only: a raw U+0085 / U+2028 in an id would split the record for line readers
        # that follow Unicode line breaks (Python's str.splitlines)
        text = out.to_json(orient="records", lines=True, force_ascii=True) if len(out) else ""
        if args.output:
            write_text(text, args.output)
        else:
            sys.stdout.write(text)
    print(f"score: {len(records)} prompts scored with {args.checkpoint}", file=sys.stderr)
    return 0
