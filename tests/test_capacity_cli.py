"""`pars capacity` flags: a flag the command would silently ignore is refused in one line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import one_line_error, run_cli

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--M", "5", "--rate", "12"], "--rate, --M"),
        (["--M", "0"], "--M"),  # 0 is a value given, not "unset"
        (["--json"], "--json"),
        (["--workload", "2:1"], "--workload"),
        (["--engine-fit", "metrics/engine_fit.json"], "--engine-fit"),
    ],
)
def test_stage_refuses_the_flags_it_would_ignore(capsys, tmp_path, monkeypatch, flags, named):
    monkeypatch.chdir(tmp_path)  # nothing may be written: the stage must not start
    rc, _, err = run_cli(capsys, "capacity", "--stage", "--params", PARAMS, *flags)
    assert "--stage" in one_line_error(rc, err, "capacity", named)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "flags, named",
    [
        (
            ["--lengths", "x.parquet", "--prompt", "uniform:1:2", "--answer", "uniform:1:2"],
            "--prompt and --answer and --lengths",
        ),
        (["--lengths", "x.parquet", "--workload", "2:1"], "--workload and --lengths"),
        (["--prompt", "uniform:1:2", "--answer", "uniform:1:2", "--workload", "1:2"], "--workload and --prompt"),
    ],
)
def test_one_workload_source_only(capsys, flags, named):
    rc, _, err = run_cli(capsys, "capacity", "--params", PARAMS, "--rate", "1", *flags)
    assert "give one workload" in one_line_error(rc, err, "capacity", named)


def test_default_workload_and_prompt_with_answer_still_answer(capsys):
    rc, out, _ = run_cli(capsys, "capacity", "--params", PARAMS, "--rate", "1")
    assert rc == 0 and "U(10,1600)" in out  # 1:1 when no workload is given
    rc, out, _ = run_cli(
        capsys, "capacity", "--params", PARAMS, "--rate", "1", "--prompt", "uniform:10:20", "--answer", "uniform:10:30"
    )
    assert rc == 0 and "U(10,20)" in out and "U(10,30)" in out


@pytest.mark.parametrize("rate", ["0", "-0", "0.0", "-1"])
def test_rate_must_be_positive(capsys, rate):
    rc, _, err = run_cli(capsys, "capacity", "--params", PARAMS, f"--rate={rate}")
    assert "must be positive" in one_line_error(rc, err, "capacity", "--rate")
