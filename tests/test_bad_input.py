"""Bad input, property-based: `pars` commands fed random flags and files either succeed (with an
answer that uses what was asked for) or exit non-zero with ONE stderr line `pars <cmd>: error: ...`
naming the flag, file or line at fault. Never a traceback, never a silently wrong answer.

Each property drives `pipeline.cli.main` in-process; an exception escaping it fails the test."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from helpers import one_line_error, params_file, run_cli
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeline.cli import main as pars
from pipeline.errors import PARSError

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def examples(n: int):
    # fixtures (capsys, module tmp dirs) are reset by hand per example; no example database in the repo
    return settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("bad_input")


def fresh(workdir: Path) -> Path:
    """A new directory per hypothesis example (fixtures are not reset between examples)."""
    return Path(tempfile.mkdtemp(dir=workdir))


# ---------------------------------------------------------------- pars capacity

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**15), max_value=10**15).map(str),
    st.integers(min_value=1, max_value=10**6).map(str),
    st.sampled_from(
        [
            "0",
            "-0",
            "0.0",
            "1e400",
            "-1e400",
            "nan",
            "inf",
            "-inf",
            "",
            "abc",
            "1_000",
            " 7",
            "0x10",
            "1e-320",
            "1e308",
            "0.9999999999999999",
            "131000",
        ]
    ),
)
# flag -> the key of `--json` output that must then hold the value asked for
CAPACITY_FLAGS = {"--M": "M", "--chunk": "chunk", "--step-time": "step_time", "--margin": "margin", "--rate": "rate"}


def _capacity_answer(out: str) -> dict:
    d = json.loads(out[out.index("{") :])
    for key in ("mu", "stable_below", "expected_g"):
        assert math.isfinite(d[key]) and d[key] > 0, d
    assert 0 < d["delta"] < 1 and d["replicas"]["minimum"] >= 1, d
    return d


@examples(60)
@given(flag=st.sampled_from(sorted(CAPACITY_FLAGS)), value=NUMBERS)
def test_capacity_numeric_flags(capsys, flag, value):
    argv = ["capacity", "--params", PARAMS, "--json", f"{flag}={value}"]
    if flag != "--rate":
        argv.append("--rate=1")
    rc, out, err = run_cli(capsys, *argv)
    if rc != 0:
        one_line_error(rc, err, "capacity", flag)
        return
    d = _capacity_answer(out)
    got = d["replicas"][CAPACITY_FLAGS[flag]] if flag in ("--margin", "--rate") else d[CAPACITY_FLAGS[flag]]
    assert got == float(value)  # the value asked for, never a default in its place (0 included)


LENGTHS = st.one_of(
    st.text(max_size=20),
    st.builds(
        "{}{}:{}".format,
        st.sampled_from(["uniform:", "", "normal:", "uniform: "]),
        st.integers(-(10**13), 10**13),
        st.integers(-(10**13), 10**13),
    ),
    st.builds("uniform:{}:{}".format, st.integers(0, 3000), st.integers(0, 3000)),
    st.builds("uniform:{}:{}".format, st.integers(1, 10), st.sampled_from([10**6, 10**7, 10**7 + 1, 10**12])),
)


@examples(50)
@given(prompt=LENGTHS, answer=LENGTHS, M=st.one_of(st.none(), st.integers(1, 10**12)))
def test_capacity_length_distributions(capsys, prompt, answer, M):
    argv = ["capacity", "--params", PARAMS, "--json", "--rate=1", f"--prompt={prompt}", f"--answer={answer}"]
    if M is not None:
        argv.append(f"--M={M}")
    rc, out, err = run_cli(capsys, *argv)
    if rc != 0:
        one_line_error(rc, err, "capacity", "--prompt", "--answer", "--M", "capacity.M")
        return
    d = _capacity_answer(out)
    lo_s, hi_s = (int(x) for x in prompt.split(":")[-2:])
    lo_o, hi_o = (int(x) for x in answer.split(":")[-2:])
    assert 1 <= lo_s <= hi_s <= 10**7 and 1 <= lo_o <= hi_o <= 10**7
    assert d["delta"] == pytest.approx((hi_s + hi_o) / d["M"])  # the workload asked for


def test_capacity_engine_fit_files(capsys, workdir):
    d = fresh(workdir)
    good = {"M_tokens": 20000, "chunk": 256, "step_time": {"mean_s": 0.02}}
    cases = {
        "notjson.json": b"{",
        "list.json": b"[1]",
        "nokey.json": b"{}",
        "zero.json": json.dumps({**good, "M_tokens": 0}).encode(),
        "nan.json": json.dumps({**good, "step_time": {"mean_s": float("nan")}}).encode(),
        "string.json": json.dumps({**good, "chunk": "256"}).encode(),
    }
    for name, blob in cases.items():
        (d / name).write_bytes(blob)
        rc, _, err = run_cli(capsys, "capacity", "--params", PARAMS, "--engine-fit", d / name)
        one_line_error(rc, err, "capacity", d / name)
    (d / "good.json").write_text(json.dumps(good))
    rc, out, _ = run_cli(capsys, "capacity", "--params", PARAMS, "--engine-fit", d / "good.json", "--json")
    assert rc == 0 and json.loads(out[out.index("{") :])["M"] == 20000
    rc, _, err = run_cli(capsys, "capacity", "--params", PARAMS, "--engine-fit", d / "absent.json")
    one_line_error(rc, err, "capacity", d / "absent.json")


# ---------------------------------------------------------------- pars score


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_bert_config, tokenizer):
    """A tiny random checkpoint as the export stage leaves it (files_sha256 included)."""
    import torch

    from pipeline.export import record_file_hashes
    from pipeline.ranking.checkpoint import save_checkpoint
    from pipeline.ranking.model import LengthRanker

    torch.manual_seed(0)
    path = save_checkpoint(
        LengthRanker.from_config(tiny_bert_config),
        tokenizer,
        tmp_path_factory.mktemp("export") / "ckpt",
        method="pairwise",
        max_length=64,
        encoder="tiny-random-bert",
    )
    record_file_hashes(path)
    return path


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
RECORD = st.one_of(
    st.builds(lambda t: {"prompt": t}, st.text(max_size=40)),
    st.builds(lambda i, t: {"id": i, "prompt": t}, JSON, st.text(max_size=40)),
    st.dictionaries(st.sampled_from(["prompt", "id", "text"]), JSON, max_size=3),
    JSON,
)
LINE = st.one_of(
    RECORD.map(lambda r: json.dumps(r).encode()),
    RECORD.map(lambda r: json.dumps(r).encode()),
    st.binary(max_size=30),
    st.sampled_from([b"", b"  ", b"\r", b"\xff\xfe", b'{"prompt": "\\ud800"}']),
)


def _score_ok(out: str, n_records: int) -> None:
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["index"] for r in rows] == list(range(n_records))
    assert np.isfinite([r["score"] for r in rows]).all()


@examples(30)
@given(lines=st.lists(LINE, max_size=5))
@example(lines=[b'{"id": {"\\u0085": null}, "prompt": ""}'])  # U+0085 in an id once split an output line
def test_score_random_jsonl(capsys, workdir, checkpoint, lines):
    src = fresh(workdir) / "in.jsonl"
    blob = b"\n".join(lines)
    src.write_bytes(blob)
    rc, out, err = run_cli(capsys, "score", src, "--checkpoint", checkpoint)
    if rc != 0:
        one_line_error(rc, err, "score", src)
        return
    _score_ok(out, sum(1 for raw in blob.split(b"\n") if raw.decode("utf-8").strip()))


@examples(20)
@given(value=st.one_of(st.integers(-(10**12), 0).map(str), st.integers(1, 10**12).map(str), st.text(max_size=8)))
def test_score_batch_size(capsys, workdir, checkpoint, value):
    src = fresh(workdir) / "in.jsonl"
    src.write_text('{"prompt": "hello"}\n{"prompt": "write an essay"}\n')
    rc, out, err = run_cli(capsys, "score", src, "--checkpoint", checkpoint, f"--batch-size={value}")
    if rc != 0:
        one_line_error(rc, err, "score", "--batch-size")
        return
    assert int(value) >= 1
    _score_ok(out, 2)


def _copy(checkpoint: Path, workdir: Path) -> Path:
    return Path(shutil.copytree(checkpoint, fresh(workdir) / "ckpt"))


@examples(30)
@given(meta=JSON)
def test_score_checkpoint_with_any_json_as_pars_json(capsys, workdir, checkpoint, meta):
    ckpt = _copy(checkpoint, workdir)
    (ckpt / "pars.json").write_text(json.dumps(meta))
    (src := ckpt.parent / "in.jsonl").write_text('{"prompt": "hello"}\n')
    rc, _, err = run_cli(capsys, "score", src, "--checkpoint", ckpt)
    one_line_error(rc, err, "score", ckpt)


@examples(40)
@given(
    key=st.sampled_from(
        [
            "format_version",
            "max_length",
            "head_fraction",
            "pooling",
            "score_direction",
            "weights_sha256",
            "files_sha256",
            "method",
            "encoder",
        ]
    ),
    value=st.one_of(JSON, st.integers(-3, 300), st.floats(-1, 2), st.sampled_from([None, True, 1.0, "1"])),
)
@example(key="max_length", value=2)  # a length, but [CLS] and [SEP] fill it: found by a CI draw
def test_score_checkpoint_with_one_pars_json_value_changed(capsys, workdir, checkpoint, key, value):
    ckpt = _copy(checkpoint, workdir)
    meta = json.loads((ckpt / "pars.json").read_text())
    (ckpt / "pars.json").write_text(json.dumps({**meta, key: value}))
    (src := ckpt.parent / "in.jsonl").write_text('{"prompt": "hello"}\n{"prompt": "write an essay on Rome"}\n')
    rc, out, err = run_cli(capsys, "score", src, "--checkpoint", ckpt)
    if rc != 0:
        one_line_error(rc, err, "score", ckpt)
        return
    _score_ok(out, 2)


@examples(20)
@given(data=st.data(), junk=st.binary(min_size=1, max_size=16), how=st.sampled_from(["append", "replace", "delete"]))
def test_score_refuses_any_file_changed_after_export(capsys, workdir, checkpoint, data, junk, how):
    ckpt = _copy(checkpoint, workdir)
    listed = sorted(json.loads((ckpt / "pars.json").read_text())["files_sha256"])
    name = data.draw(st.sampled_from(listed))
    target = ckpt / name
    if how == "delete":
        target.unlink()
    else:
        target.write_bytes((target.read_bytes() if how == "append" else b"") + junk)
    (src := ckpt.parent / "in.jsonl").write_text('{"prompt": "hello"}\n')
    rc, _, err = run_cli(capsys, "score", src, "--checkpoint", ckpt)
    one_line_error(rc, err, "score", name)


# ---------------------------------------------------------------- pars simulate --trace


def _trace_is_valid(blob: bytes) -> bool:
    """The trace format: one time in seconds (0 .. 1e11) a line; blank lines and # comments skipped."""
    times = []
    for raw in blob.splitlines():
        try:
            text = raw.decode("utf-8").split("#", 1)[0].strip()
        except UnicodeDecodeError:
            return False
        if text:
            try:
                times.append(float(text))
            except ValueError:
                return False
    return bool(times) and all(0 <= t <= 1e11 for t in times)


TRACE_LINE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(0, 1e4).map(repr),
    st.integers(-(10**13), 10**13).map(str),
    st.text(max_size=8),
    st.just(""),
    st.just("# note"),
)


@examples(40)
@given(blob=st.one_of(st.lists(TRACE_LINE, max_size=6).map(lambda ls: "\n".join(ls).encode()), st.binary(max_size=40)))
def test_simulate_trace_files(capsys, workdir, monkeypatch, blob):
    d = fresh(workdir)
    monkeypatch.chdir(d)  # simulate writes metrics/ and plots/ relative to the working directory
    trace = d / "trace.txt"
    trace.write_bytes(blob)
    # no data root: a trace that is accepted gets as far as the missing prompts, cheaply
    rc, _, err = run_cli(capsys, "simulate", "--params", PARAMS, "--data-root", d / "data", "--trace", trace)
    line = one_line_error(rc, err, "simulate", trace, d / "data")
    assert (str(trace) not in line) == _trace_is_valid(blob), line  # a bad trace is named; a good one passes


@pytest.mark.parametrize(
    "name, make, message",
    [
        ("t.csv", lambda p: p.write_text("arrival\n1\nsoon\n"), "t.csv:3: 'soon' is not a time"),
        ("t.csv", lambda p: p.write_text("time\n1\n"), "no column 'arrival'"),
        ("t.csv", lambda p: p.write_bytes(b"\xff\xfe\x00"), "t.csv"),
        ("t.parquet", lambda p: p.write_bytes(b"PAR1 not really"), "not a readable parquet file"),
        (
            "t.parquet",
            lambda p: __import__("pandas").DataFrame({"arrival": [0.0, -1.0]}).to_parquet(p),
            "t.parquet: row 1: '-1.0' is not a time",
        ),
    ],
)
def test_simulate_csv_and_parquet_traces(capsys, tmp_path, monkeypatch, name, make, message):
    monkeypatch.chdir(tmp_path)
    make(tmp_path / name)
    rc, _, err = run_cli(
        capsys, "simulate", "--params", PARAMS, "--data-root", tmp_path / "data", "--trace", tmp_path / name
    )
    assert message in one_line_error(rc, err, "simulate", tmp_path / name)


def _params_with(tmp_path: Path, section: str, **changes) -> Path:
    """params_file with keyword changes (`__` reaches into mappings: engine__M)."""
    return params_file(tmp_path, section, {k.replace("__", "."): v for k, v in changes.items()})


@pytest.mark.parametrize(
    "cmd, section, changes, named",
    [
        ("simulate", "simulate", {"burst": -1}, "simulate.burst -1"),
        ("simulate", "simulate", {"poisson_loads": [0.5, float("inf")]}, "simulate.poisson_loads[1] inf"),
        ("simulate", "simulate", {"poisson_loads": 0.8}, "simulate.poisson_loads 0.8: expected a list"),
        ("simulate", "simulate", {"policies": ["fcfs", "sjf"]}, "simulate.policies: unknown policy 'sjf'"),
        ("simulate", "simulate", {"engine__step_c0": 0}, "simulate.engine.step_c0 0"),
        ("simulate", "simulate", {"engine__M": "lots"}, "simulate.engine.M 'lots'"),
        ("capacity", "capacity", {"rates": [1, float("inf")]}, "capacity.rates[1] inf"),
        ("capacity", "capacity", {"margin": 1.5}, "capacity.margin 1.5"),
        ("capacity", "capacity", {"token_budget": 0}, "capacity.token_budget 0"),
    ],
)
def test_bad_params_sections_are_named(capsys, tmp_path, monkeypatch, cmd, section, changes, named):
    monkeypatch.chdir(tmp_path)  # nothing may be written before the check; if it were, not into the repo
    params = _params_with(tmp_path, section, **changes)
    argv = [cmd, "--params", params] + (["--stage"] if cmd == "capacity" else ["--data-root", tmp_path / "data"])
    rc, _, err = run_cli(capsys, *argv)
    one_line_error(rc, err, cmd, named)
    assert not (tmp_path / "metrics").exists() and not (tmp_path / "plots").exists()


# ---------------------------------------------------------------- output paths under a file


@examples(25)
@given(
    depth=st.integers(0, 2),
    cmd=st.sampled_from(["score", "prepare", "report", "lengths"]),
    suffix=st.sampled_from([".jsonl", ".parquet", ".json", ".md"]),
)
def test_an_output_path_under_a_file_is_one_line(capsys, workdir, monkeypatch, checkpoint, depth, cmd, suffix):
    d = fresh(workdir)
    blocker = d / "notes.txt"
    blocker.write_text("not a directory")
    out = blocker.joinpath(*["sub"] * depth, f"out{suffix}")
    src = d / "in.jsonl"
    src.write_text('{"prompt": "hello"}\n')
    monkeypatch.setenv("PARS_PARAMS", str(PARAMS))
    argv = {
        "score": ["score", src, "--checkpoint", checkpoint, "-o", out],
        "prepare": ["prepare", "--out", out],
        "report": ["report", "--out", out],
        "lengths": ["lengths", "--metrics", out, "--generations", d],
    }[cmd]
    rc, _, err = run_cli(capsys, *argv)
    if cmd == "score" and suffix not in (".jsonl", ".parquet"):
        one_line_error(rc, err, cmd, "-o")
    else:
        assert "is a file, not a directory" in one_line_error(rc, err, cmd, blocker)


def test_an_output_path_that_is_a_directory_is_one_line(capsys, tmp_path, checkpoint):
    (tmp_path / "in.jsonl").write_text('{"prompt": "hello"}\n')
    (tmp_path / "scores.jsonl").mkdir()
    rc, _, err = run_cli(
        capsys, "score", tmp_path / "in.jsonl", "--checkpoint", checkpoint, "-o", tmp_path / "scores.jsonl"
    )
    assert "is a directory" in one_line_error(rc, err, "score", tmp_path / "scores.jsonl")


# ---------------------------------------------------------------- the CLI's error reporting


def test_debug_switch_and_pars_debug_show_the_traceback(capsys, monkeypatch):
    argv = ["capacity", "--params", str(PARAMS), "--M=0"]
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 1 and err == "pars capacity: error: --M 0: must be positive\n"
    with pytest.raises(PARSError, match="--M 0"):
        pars(["--debug", *argv])
    monkeypatch.setenv("PARS_DEBUG", "1")
    with pytest.raises(PARSError, match="--M 0"):
        pars(argv)


@pytest.mark.parametrize(
    "exc, rc, expected",
    [
        (
            RuntimeError("boom"),
            2,
            "pars capacity: internal error: RuntimeError: boom (run with --debug for the traceback)",
        ),
        (KeyboardInterrupt(), 130, "pars capacity: interrupted"),
        (
            OSError(28, "No space left on device", "metrics/x.json"),
            1,
            "pars capacity: error: metrics/x.json: No space left on device",
        ),
        (KeyError("params.yaml: capacity.M is missing"), 1, "pars capacity: error: params.yaml: capacity.M is missing"),
        (PARSError("line one\nline two"), 1, "pars capacity: error: line one line two"),
    ],
)
def test_every_failure_is_one_line(capsys, monkeypatch, exc, rc, expected):
    import pipeline.capacity

    def fail(argv):
        raise exc

    monkeypatch.setattr(pipeline.capacity, "main", fail)
    assert run_cli(capsys, "capacity")[::2] == (rc, expected + "\n")


def test_usage_errors_and_help(capsys):
    rc, _, err = run_cli(capsys, "capacity", "--bogus")
    assert (rc, err) == (1, "pars capacity: error: unrecognized arguments: --bogus (see `pars capacity --help`)\n")
    rc, _, err = run_cli(capsys, "nope")
    assert rc == 2 and len(err.splitlines()) == 1 and "unknown command 'nope'" in err
    rc, out, _ = run_cli(capsys, "capacity", "--help")
    assert rc == 0 and "--step-time" in out
    assert "--debug" in run_cli(capsys, "--help")[1]


def test_data_files_honour_the_umask(tmp_path):
    import pandas as pd

    from pipeline.contracts import PAIRS, write_json, write_table

    df = pd.DataFrame({"a": ["x"], "b": ["y"], "len_a": [1.0], "len_b": [2.0], "label": [-1]})
    old = os.umask(0o022)
    try:
        for mask, mode in ((0o022, 0o644), (0o007, 0o660)):
            os.umask(mask)
            table = write_table(df, tmp_path / f"{mask:o}" / "pairs.parquet", PAIRS)
            meta = write_json({"k": 1}, tmp_path / f"{mask:o}" / "meta.json")
            assert (table.stat().st_mode & 0o777, meta.stat().st_mode & 0o777) == (mode, mode)
    finally:
        os.umask(old)


def test_checkpoint_files_honour_the_umask(tmp_path, tiny_bert_config, tokenizer):
    """safetensors writes its files 0600: a checkpoint directory written whole (train, export, blend
    and materialize all write through replace_dir) gets every file the mode any new file gets, so a
    team can share it through one DVC cache."""
    from conftest import save_tiny_checkpoint

    from pipeline.dirs import replace_dir

    old = os.umask(0o022)
    try:
        ckpt = replace_dir(tmp_path / "ckpt", lambda tmp: save_tiny_checkpoint(tmp, tiny_bert_config, tokenizer))
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in ckpt.iterdir() if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


@pytest.mark.parametrize("name", ["", "  "])
def test_a_blank_encoder_name_is_refused_not_read_as_the_working_directory(name):
    from pipeline.errors import PARSError
    from pipeline.ranking.model import load_tokenizer

    with pytest.raises(PARSError, match="blank; name an encoder"):
        load_tokenizer(name)
