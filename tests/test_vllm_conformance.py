"""Conformance: vLLM 0.32.0's own scheduler tests, unmodified, run against the PARS scheduler.

scripts/fetch_vllm_tests.py (run by scripts/setup.sh) extracts tests/v1/core/ from the pinned vLLM source
archive into .cache/vllm-tests/0.32.0/. Each mode runs those test files in a subprocess with the plugin
tests/vllm_conformance/pars_conformance_plugin.py (model shims, the PARS substitution, a JSON report):

    stock       vLLM's own Scheduler / AsyncScheduler: checks the shims (everything should pass)
    checkpoint  PARSScheduler / PARSAsyncScheduler scoring with a tiny random checkpoint
    arrival     the PARS classes with client scores = arrival time (PARS order = vLLM's order)

and compares each test's outcome with tests/vllm_conformance/expected_failures.yaml: a failure not
listed there, or a pass of a listed one, fails the mode. By hand (from the repository root):

    .venv/bin/python -m pytest tests/test_vllm_conformance.py -m conformance -k arrival
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VLLM_TESTS = ROOT / ".cache" / "vllm-tests" / "0.32.0"
PLUGIN_DIR = Path(__file__).resolve().parent / "vllm_conformance"
EXPECTED = PLUGIN_DIR / "expected_failures.yaml"
FILES = [
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/test_priority_preemption_bug.py",
    "tests/v1/core/test_priority_scheduler_random.py",
]
MODES = ("stock", "checkpoint", "arrival")
TORCHVISION = VLLM_TESTS.parent / "torchvision-0.28.0"  # scripts/fetch_vllm_tests.py: TORCHVISION_DEST
TIMEOUT_S = 1800  # per mode; a stuck scheduler loop must not eat CI's whole budget


def load_expected(mode: str) -> dict[str, tuple[str, bool]]:
    """{node id: (reason, strict)} for one mode; a malformed entry is an error, not a silent pass."""
    import yaml

    data = yaml.safe_load(EXPECTED.read_text()) or {}
    entries = data.get(mode) or {}
    expected = {}
    for nodeid, value in entries.items():
        if isinstance(value, dict):
            reason, strict = value.get("reason"), value.get("strict", True)
        else:
            reason, strict = value, True
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"{EXPECTED.name}: {mode}: {nodeid} needs a one-line reason")
        expected[nodeid] = (reason, bool(strict))
    return expected


def compare(outcomes: dict[str, str], expected: dict[str, tuple[str, bool]]) -> tuple[list[str], list[str], list[str]]:
    """(unexpected failures, unexpected passes, listed tests that were not run at all)."""
    failed = {n for n, o in outcomes.items() if o in ("failed", "error")}
    passed = {n for n, o in outcomes.items() if o in ("passed", "xpassed")}
    unexpected_fail = sorted(failed - set(expected))
    unexpected_pass = sorted(n for n in passed & set(expected) if expected[n][1])
    missing = sorted(n for n in expected if n not in outcomes)
    return unexpected_fail, unexpected_pass, missing


def _skip_unless_ready() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (scripts/setup.sh installs it with the cpu or gpu extra)")
    if not (VLLM_TESTS / ".complete").is_file():
        pytest.skip(
            f"vLLM's scheduler tests are not in {VLLM_TESTS.relative_to(ROOT)}: run "
            "`python scripts/fetch_vllm_tests.py` (downloads the vLLM 0.32.0 source archive from PyPI)"
        )


@pytest.mark.conformance
@pytest.mark.parametrize("mode", MODES)
def test_vllm_scheduler_suite(mode, tmp_path, request):
    _skip_unless_ready()
    expected = load_expected(mode)
    # A developer's PARS_* settings must not leak into the run; the plugin sets what each mode needs.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARS_")}
    env.update(
        PARS_CONFORMANCE_MODE=mode,
        PARS_CONFORMANCE_REPORT=str(tmp_path / "report.json"),
        # torchvision for the multimodal tests' processors, kept out of the venv (see the fetch script)
        PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGIN_DIR), str(TORCHVISION), env.get("PYTHONPATH")])),
    )
    if mode != "stock":
        env["PARS_CHECKPOINT"] = str(request.getfixturevalue("tiny_checkpoint"))
    command = [
        sys.executable,
        "-m",
        "pytest",
        *FILES,
        "-p",
        "pars_conformance_plugin",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:benchmark",
        "-q",
        "-rfE",
        "--tb=line",
        "-W",
        "ignore::DeprecationWarning",
    ]
    # cwd: the extracted tree, so `tests.v1.core` is vLLM's package and vLLM's pyproject.toml (its
    # pytest markers) is the rootdir config, not ours.
    proc = subprocess.run(command, cwd=VLLM_TESTS, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    log = tmp_path / "pytest.log"
    log.write_text(proc.stdout + proc.stderr)
    report_path = tmp_path / "report.json"
    if not report_path.is_file() or proc.returncode not in (0, 1):  # 1: some tests failed (maybe expected)
        pytest.fail(
            f"vLLM's tests did not run in mode {mode} (exit {proc.returncode}); last output:\n"
            + (proc.stdout + proc.stderr)[-4000:]
        )
    report = json.loads(report_path.read_text())
    outcomes = report["outcomes"]
    assert outcomes, f"no test ran in mode {mode}; see {log}"
    if mode != "stock":
        assert report["pars_schedulers"] > 0, "the PARS substitution did not take: no PARS scheduler was built"

    unexpected_fail, unexpected_pass, missing = compare(outcomes, expected)
    counts = {o: sum(1 for v in outcomes.values() if v == o) for o in sorted(set(outcomes.values()))}
    print(f"vLLM conformance, mode {mode}: {counts}; unavailable models: {report['unavailable_models']}")
    problems = []
    if unexpected_fail:
        problems.append(
            f"{len(unexpected_fail)} unexpected failure(s) (if explained, add to "
            f"{EXPECTED.relative_to(ROOT)} under `{mode}:`):\n"
            + "\n".join(f'  {n}: "TODO: reason"' for n in unexpected_fail)
        )
    if unexpected_pass:
        problems.append(
            f"{len(unexpected_pass)} listed failure(s) now pass (remove from `{mode}:`):\n"
            + "\n".join(f"  {n}" for n in unexpected_pass)
        )
    if missing:
        problems.append(
            f"{len(missing)} listed test(s) did not run (renamed?):\n" + "\n".join(f"  {n}" for n in missing)
        )
    assert not problems, f"mode {mode}: " + "\n".join(problems) + f"\nfull log: {log}"


def test_expected_failures_file_is_well_formed():
    """Every entry has a reason and names one of the four files; runs without vLLM."""
    for mode in MODES:
        for nodeid in load_expected(mode):
            assert nodeid.split("::")[0] in FILES, f"{mode}: {nodeid} is not in {FILES}"


def test_compare_reports_unexpected_failures_and_passes():
    expected = {"a": ("fcfs: x", True), "b": ("async-off: y", False), "c": ("z", True), "gone": ("w", True)}
    outcomes = {"a": "failed", "b": "passed", "c": "passed", "d": "error", "e": "passed", "f": "skipped"}
    assert compare(outcomes, expected) == (["d"], ["c"], ["gone"])
