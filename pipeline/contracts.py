"""The data contracts between stages, in one place (the stages are described in README.md).

Every stage writes its tables through `write_table` (schema checked, written atomically)
and reads them through `read_table` (schema checked, with a clear error naming the file).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.dirs import share
from pipeline.errors import PARSError

PROMPTS = pa.schema(
    [
        ("prompt_id", pa.string()),  # stable hash of dataset and normalised text
        ("dataset", pa.string()),
        ("prompt", pa.string()),
        ("split", pa.string()),  # train / val / test, decided by a hash of prompt_id
        ("source_id", pa.string()),  # the record's id in its source
    ]
)

GENERATIONS = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("sample", pa.int32()),
        ("output_tokens", pa.int32()),  # every generated token, reasoning included
        ("reasoning_tokens", pa.int32()),
        ("finish_reason", pa.string()),  # "stop" or "length" (cut at max_tokens: a lower bound)
        ("prompt_tokens", pa.int32()),
        ("text", pa.string()),
        ("reasoning", pa.string()),
    ]
)

# GENERATIONS without the answers' text: what the readers of lengths need (pairs, evaluate, lengths,
# simulate, capacity). Reading only these keeps a table of long reasoning traces out of memory.
GENERATION_COUNTS = pa.schema([f for f in GENERATIONS if f.name not in ("text", "reasoning")])

PAIRS = pa.schema(
    [
        ("a", pa.string()),
        ("b", pa.string()),
        ("len_a", pa.float64()),
        ("len_b", pa.float64()),
        ("label", pa.int8()),  # +1 when a's answer is longer, -1 otherwise
    ]
)

# one row per labelled prompt (the pairs stage; rules in pipeline.ranking.labels)
LABELS = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("split", pa.string()),
        ("length", pa.float64()),  # mean output_tokens over samples (a lower bound if truncated)
        ("truncated", pa.bool_()),  # some sample hit max_tokens
        ("n_samples", pa.int32()),
    ]
)

# Scores of every predictor on every test prompt (the evaluate stage; read by simulate and benchmarks)
SCORES = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("dataset", pa.string()),
        ("train_model", pa.string()),  # the predictor: trained on this model's (or set's) answers
        ("method", pa.string()),
        ("score", pa.float32()),  # higher = longer answer predicted
    ]
)

SPLITS = ("train", "val", "test")
FINISH_REASONS = ("stop", "length")


def nested_value(d: Any, *keys: str) -> Any:
    """d[k1][k2]..., or None where a level is missing or not a mapping (a damaged metrics file)."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _check(df: pd.DataFrame | pa.Table | pa.Schema, schema: pa.Schema, where: str) -> None:
    columns = df.names if isinstance(df, pa.Schema) else df.column_names if isinstance(df, pa.Table) else df.columns
    missing = [name for name in schema.names if name not in columns]
    if missing:
        raise ValueError(f"{where}: missing column(s) {missing}; expected {schema.names}")


def ensure_parent(path: str | Path, create: bool = True) -> Path:
    """Create the directory an output file goes in (or only check, `create=False`); a file in the
    way (`-o notes.txt/out.jsonl`) or an output path that is a directory is refused in one line."""
    path = Path(path)
    if path.is_dir():
        raise PARSError(f"cannot write {path}: it is a directory")
    for parent in (path.parent, *path.parent.parents):
        if parent.exists():
            if not parent.is_dir():
                raise PARSError(f"cannot write {path}: {parent} is a file, not a directory")
            break
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_table(df: pd.DataFrame, path: str | Path, schema: pa.Schema) -> Path:
    """Write `df` with exactly `schema`'s columns to `path`, atomically (temp file + rename)."""
    path = Path(path)
    _check(df, schema, str(path))
    table = pa.Table.from_pandas(df[schema.names], schema=schema, preserve_index=False)
    ensure_parent(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        share(tmp)  # mkstemp makes the file 0600
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_table(path: str | Path, schema: pa.Schema) -> pd.DataFrame:
    """Read a contract table, naming the file when it is missing, corrupt or of the wrong shape."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (has the stage that writes it run?)")
    try:  # pyarrow raises several types for a corrupt file; opened once, the footer read once
        parquet = pq.ParquetFile(path)
        stored = parquet.schema_arrow
    except Exception as exc:
        raise ValueError(f"{path} is not a readable parquet file: {exc}") from exc
    _check(stored, schema, str(path))
    try:
        table = parquet.read(columns=schema.names)  # only what the reader asked for
    except Exception as exc:
        raise ValueError(f"{path} is not a readable parquet file: {exc}") from exc
    for field in schema:
        stored = table.schema.field(field.name).type
        if not _type_fits(stored, field.type):
            raise ValueError(f"{path}: column {field.name!r} holds {stored}, expected {field.type}")
    df = table.to_pandas()[schema.names]
    _check_rows(df, schema, path)
    return df


def _check_rows(df: pd.DataFrame, schema: pa.Schema, path: Path) -> None:
    """The row rules of PROMPTS and LABELS, which every reader relies on: one row per prompt_id (a
    repeat is answered twice, or merged into repeated rows), a known split (a null one would become
    'None'), and for labels a finite length >= 0 and a truncated flag (a null reads as False). A
    damaged file fails here, naming it, rather than giving silently wrong numbers downstream."""
    if schema.equals(PROMPTS):
        required = ("prompt_id", "dataset", "prompt", "split")
    elif schema.equals(LABELS):
        required = ("prompt_id", "split", "length", "truncated")
    else:
        return
    ids = df["prompt_id"]
    for column in required:
        _refuse(df[column].isna(), ids, path, f"have no {column}")
    _refuse(ids.duplicated(), ids, path, "repeat an earlier prompt_id")
    _refuse(~df["split"].isin(SPLITS), ids, path, f"have a split other than {', '.join(SPLITS)}")
    if schema.equals(LABELS):
        length = df["length"].to_numpy(np.float64)
        _refuse(pd.Series(~np.isfinite(length) | (length < 0)), ids, path, "have a negative or non-finite length")


def _refuse(bad: pd.Series, ids: pd.Series, path: Path, what: str) -> None:
    """One line naming the file, how many rows break a rule, and the first one's prompt_id (or row)."""
    rows = np.flatnonzero(bad.to_numpy(bool))
    if len(rows):
        first = ids.iloc[rows[0]]
        example = f"prompt_id {first!r}" if isinstance(first, str) else f"row {rows[0]}"
        raise ValueError(f"{path}: {len(rows)} row(s) {what} (e.g. {example})")


def _type_fits(stored: pa.DataType, expected: pa.DataType) -> bool:
    """Whether a stored column reads as `expected`: any integer width for an integer, an integer or a
    float for a float, a string however encoded for a string. A column of nulls only fits any type
    (the stage's own checks name the nulls); "123" for a token count does not."""
    if pa.types.is_dictionary(stored):
        stored = stored.value_type
    if pa.types.is_null(stored):
        return True
    if pa.types.is_integer(expected):
        return pa.types.is_integer(stored)
    if pa.types.is_floating(expected):
        return pa.types.is_integer(stored) or pa.types.is_floating(stored)
    if pa.types.is_string(expected):
        return pa.types.is_string(stored) or pa.types.is_large_string(stored)
    return stored == expected


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: the same inode when both exist (a link counts), else the same
    resolved path. An output that is an input would replace it."""
    a, b = Path(a), Path(b)
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def read_json(path: str | Path, what: type = dict) -> Any:
    """A JSON file's content, which must be a `what` (an object by default); a missing file, a syntax
    error (named by file, line and column) or another shape is one clear error."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (has the stage that writes it run?)")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PARSError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError:
        raise PARSError(f"{path}: not a UTF-8 text file") from None
    if not isinstance(obj, what):
        kind = {dict: "an object", list: "an array"}.get(what, what.__name__)
        raise PARSError(f"{path}: must hold {kind} in JSON, not {type(obj).__name__}")
    return obj


def write_text(text: str, path: str | Path) -> Path:
    """Write `text` (UTF-8) atomically: via a temp file and a rename, so an interrupted write leaves
    the old file (or none), never half of one."""
    path = ensure_parent(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_figure(fig, path: str | Path, **savefig: Any) -> Path:
    """Save a matplotlib figure atomically (format from the file's suffix): an interrupted run leaves
    the old figure (or none), never half of a new one."""
    from matplotlib import rcParams

    path = ensure_parent(path)
    tmp = path.with_name(f".{path.name}.tmp")
    # named, never guessed from the temp file's ".tmp"; no suffix: matplotlib's default for such a name
    fmt = path.suffix.lstrip(".") or rcParams["savefig.format"]
    try:
        fig.savefig(tmp, format=fmt, **savefig)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json(obj: Any, path: str | Path) -> Path:
    """Write JSON atomically, pretty-printed (metrics files are read by people and by DVC)."""
    return write_text(json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n", path)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# Where each stage puts things, so paths are spelled once.
def prompts_path(root: str | Path = "data") -> Path:
    return Path(root) / "prompts" / "prompts.parquet"


def generations_path(model: str, root: str | Path = "data") -> Path:
    return Path(root) / "generations" / model / "generations.parquet"


def generations_meta_path(model: str, root: str | Path = "data") -> Path:
    return Path(root) / "generations" / model / "meta.json"


def pairs_dir(model: str, root: str | Path = "data") -> Path:
    return Path(root) / "pairs" / model


def scores_path(root: str | Path = "data") -> Path:
    """The evaluate stage's test-split scores of every predictor (SCORES)."""
    return Path(root) / "scores" / "scores.parquet"


def predictor_dir(model: str, method: str, root: str | Path = "models") -> Path:
    """A trained predictor's checkpoint directory (the train stage's out)."""
    return Path(root) / model / method


def labels_path(model: str, root: str | Path = "data") -> Path:
    return pairs_dir(model, root) / "labels.parquet"
