"""`pars score`: ids reach the output exactly as they came in (type and value), ids that parquet
cannot hold are refused before scoring, and an interrupted write never leaves a truncated output."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import one_line_error, run_cli

BIG = 2**60 + 1  # a float64 rounds it
IDS = [BIG, None, 3, -7]


def _jsonl(path: Path, ids: list) -> Path:
    path.write_text("".join(json.dumps({"id": i, "prompt": f"prompt {n}"}) + "\n" for n, i in enumerate(ids)))
    return path


def _read_ids(path: Path, field: str = "id") -> list:
    if path.suffix == ".parquet":
        return pq.read_table(path).column(field).to_pylist()
    return [json.loads(line)[field] for line in path.read_text().splitlines()]


def _same(got: list, want: list) -> None:
    """Equal, and of the same type: 3 written as 3.0 is another id for a JSON reader."""
    assert got == want and [type(g) for g in got] == [type(w) for w in want], (got, want)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_integer_ids_with_a_null_round_trip_exactly(capsys, tmp_path, tiny_checkpoint, suffix):
    src = _jsonl(tmp_path / "in.jsonl", IDS)
    out = tmp_path / f"scores{suffix}"
    rc, _, err = run_cli(capsys, "score", src, "--checkpoint", tiny_checkpoint, "-o", out)
    assert rc == 0, err
    _same(_read_ids(out), IDS)
    # and to stdout
    rc, stdout, err = run_cli(capsys, "score", src, "--checkpoint", tiny_checkpoint)
    assert rc == 0, err
    _same([json.loads(line)["id"] for line in stdout.splitlines()], IDS)


def test_parquet_input_ids_keep_their_type(capsys, tmp_path, tiny_checkpoint):
    """pandas reads an int64 column with a null as float64: the ids must still come out as ints."""
    src = tmp_path / "in.parquet"
    table = pa.table({"prompt_id": pa.array(IDS, pa.int64()), "prompt": [f"p {n}" for n in range(len(IDS))]})
    pq.write_table(table, src)
    for out in (tmp_path / "scores.jsonl", tmp_path / "scores.parquet"):
        rc, _, err = run_cli(capsys, "score", src, "--checkpoint", tiny_checkpoint, "-o", out)
        assert rc == 0, err
        _same(_read_ids(out, "prompt_id"), IDS)


@pytest.mark.parametrize("ids", [["a", 1], [1, True], [2**64, 1], [{"k": 1}, 2]])
def test_ids_parquet_cannot_hold_are_refused_before_scoring(capsys, tmp_path, tiny_checkpoint, monkeypatch, ids):
    from pipeline.serving.scorer import Scorer

    src = _jsonl(tmp_path / "in.jsonl", ids)
    monkeypatch.setattr(Scorer, "score", lambda *a, **k: pytest.fail("scored before the ids were checked"))
    out = tmp_path / "scores.parquet"
    rc, _, err = run_cli(capsys, "score", src, "--checkpoint", tiny_checkpoint, "-o", out)
    assert "-o as .jsonl" in one_line_error(rc, err, "score", src)
    assert not out.exists()
    monkeypatch.undo()
    # JSONL keeps each id as it is
    rc, _, err = run_cli(capsys, "score", src, "--checkpoint", tiny_checkpoint, "-o", tmp_path / "scores.jsonl")
    assert rc == 0, err
    _same(_read_ids(tmp_path / "scores.jsonl"), ids)


def test_an_interrupted_write_leaves_the_old_output(capsys, tmp_path, tiny_checkpoint, monkeypatch):
    src = _jsonl(tmp_path / "in.jsonl", [1, 2, 3])
    jsonl, parquet = tmp_path / "scores.jsonl", tmp_path / "scores.parquet"
    for out in (jsonl, parquet):
        assert run_cli(capsys, "score", src, "--checkpoint", tiny_checkpoint, "-o", out)[0] == 0
    old = {out: out.read_bytes() for out in (jsonl, parquet)}

    def half_text(self, text, *args, **kwargs):
        with open(self, "w", encoding="utf-8") as fh:
            fh.write(text[: len(text) // 2])
        raise OSError(28, "No space left on device")

    def half_parquet(table, where, *args, **kwargs):
        Path(where).write_bytes(b"PAR1")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_text)
    monkeypatch.setattr(pq, "write_table", half_parquet)
    for out in (jsonl, parquet):
        rc, _, err = run_cli(capsys, "score", src, "--checkpoint", tiny_checkpoint, "-o", out)
        one_line_error(rc, err, "score", "No space left")
    monkeypatch.undo()
    assert {out: out.read_bytes() for out in (jsonl, parquet)} == old
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["in.jsonl", "scores.jsonl", "scores.parquet"]
    assert pd.read_parquet(parquet)["id"].tolist() == [1, 2, 3]
