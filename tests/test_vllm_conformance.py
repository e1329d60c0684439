"""Conformance: vLLM 0.32.0's own scheduler tests, unmodified, run against the PARS scheduler.

scripts/fetch_vllm_tests.py (run by scripts/setup.sh) extracts tests/v1/core/ from the pinned vLLM source
archive into .cache/vllm-tests/0.32.0/. Each mode runs those test files in subprocesses (see CHUNKS)
with the plugin tests/vllm_conformance/pars_conformance_plugin.py (model shims, the PARS substitution,
a JSON report):

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
from concurrent.futures import ThreadPoolExecutor
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
TIMEOUT_S = 2400  # per chunk; a stuck scheduler loop must not eat CI's whole budget


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


# Each mode runs as one or more chunks, a subprocess each, and the chunks of the selected modes share one
# worker per core (at most 2), longest first. Alone, stock, arrival and checkpoint take about 10, 10 and 37
# minutes on a slow 2-core CPU: in checkpoint mode vLLM's randomized priority stress test dominates (the
# PARS scheduler decodes and tokenizes every random prompt, of up to 5000 tokens in its standard profile),
# so that test runs as three chunks (-k filters on its parameter ids) of at most about 20 minutes each.
BLAST = "tests/v1/core/test_priority_scheduler_random.py"
CHUNKS = [  # (mode, chunk name, pytest arguments), longest first
    ("checkpoint", "blast-standard-caching", [BLAST, "-k", "standard and True"]),
    ("checkpoint", "blast-standard-no-caching", [BLAST, "-k", "standard and False"]),
    ("stock", "all", FILES),
    ("arrival", "all", FILES),
    ("checkpoint", "blast-preemption", [BLAST, "-k", "preemption"]),
    ("checkpoint", "rest", [f for f in FILES if f != BLAST]),
]


def run_chunk(mode: str, args: list[str], out: Path, checkpoint: Path) -> tuple[int, Path, dict | None]:
    """vLLM's tests named by `args` in one mode, in a subprocess -> (exit code, its log, JSON report)."""
    out.mkdir(parents=True, exist_ok=True)
    # A developer's PARS_* settings must not leak into the run; the plugin sets what each mode needs.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARS_")}
    env.update(
        PARS_CONFORMANCE_MODE=mode,
        PARS_CONFORMANCE_REPORT=str(out / "report.json"),
        # torchvision for the multimodal tests' processors, kept out of the venv (see the fetch script)
        PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGIN_DIR), str(TORCHVISION), env.get("PYTHONPATH")])),
        # chunks run side by side, one core each: a second thread per process would only contend
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    if mode != "stock":
        env["PARS_CHECKPOINT"] = str(checkpoint)
    command = [
        sys.executable,
        "-m",
        "pytest",
        *args,
        "-p",
        "pars_conformance_plugin",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:benchmark",
        "-q",
        "-rfE",
        "--tb=line",
        "--durations=5",
        "-W",
        "ignore::DeprecationWarning",
    ]
    # cwd: the extracted tree, so `tests.v1.core` is vLLM's package and vLLM's pyproject.toml (its
    # pytest markers) is the rootdir config, not ours.
    try:
        proc = subprocess.run(command, cwd=VLLM_TESTS, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        # POSIX hands over the output so far as bytes, even with text=True
        parts = (x.decode(errors="replace") if isinstance(x, bytes) else x for x in (exc.stdout, exc.stderr) if x)
        returncode, output = -9, "".join(parts) + f"\ntimed out after {TIMEOUT_S} s"
    log, report_path = out / "pytest.log", out / "report.json"
    log.write_text(output)
    return returncode, log, json.loads(report_path.read_text()) if report_path.is_file() else None


@pytest.fixture(scope="module")
def suite_runs(request, tmp_path_factory, tiny_bert_config, tokenizer):
    """[(mode, chunk, future of run_chunk)] for the modes this session selected, all started at once."""
    _skip_unless_ready()
    from conftest import save_tiny_checkpoint

    selected = {
        item.callspec.params["mode"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_vllm_scheduler_suite"
    }
    root = tmp_path_factory.mktemp("conformance")
    checkpoint = save_tiny_checkpoint(root / "ckpt", tiny_bert_config, tokenizer)  # one for all modes
    pool = ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1)))
    yield [
        (mode, chunk, pool.submit(run_chunk, mode, args, root / f"{mode}-{chunk}", checkpoint))
        for mode, chunk, args in CHUNKS
        if mode in selected
    ]
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.conformance
@pytest.mark.parametrize("mode", MODES)
def test_vllm_scheduler_suite(mode, suite_runs):
    expected = load_expected(mode)
    outcomes, pars_schedulers, unavailable, logs = {}, 0, set(), []
    for run_mode, chunk, future in suite_runs:
        if run_mode != mode:
            continue
        returncode, log, report = future.result()
        logs.append(str(log))
        if report is None or returncode not in (0, 1):  # 1: some tests failed (maybe expected)
            pytest.fail(
                f"vLLM's tests did not run in mode {mode}, chunk {chunk} (exit {returncode}); last output:\n"
                + log.read_text()[-4000:]
            )
        twice = sorted(set(outcomes) & set(report["outcomes"]))
        assert not twice, f"mode {mode}: chunk {chunk} ran tests another chunk ran: {twice}"
        outcomes.update(report["outcomes"])
        pars_schedulers += report["pars_schedulers"]
        unavailable.update(report["unavailable_models"])
    assert outcomes, f"no test ran in mode {mode}; see {logs}"
    if mode != "stock":
        assert pars_schedulers > 0, "the PARS substitution did not take: no PARS scheduler was built"

    unexpected_fail, unexpected_pass, missing = compare(outcomes, expected)
    counts = {o: sum(1 for v in outcomes.values() if v == o) for o in sorted(set(outcomes.values()))}
    print(f"vLLM conformance, mode {mode}: {counts}; unavailable models: {sorted(unavailable)}")
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
    assert not problems, f"mode {mode}: " + "\n".join(problems) + f"\nfull logs: {logs}"


def test_expected_failures_file_is_well_formed():
    """Every entry has a reason and names one of the four files; runs without vLLM."""
    for mode in MODES:
        for nodeid in load_expected(mode):
            assert nodeid.split("::")[0] in FILES, f"{mode}: {nodeid} is not in {FILES}"


def test_compare_reports_unexpected_failures_and_passes():
    expected = {"a": ("fcfs: x", True), "b": ("async-off: y", False), "c": ("z", True), "gone": ("w", True)}
    outcomes = {"a": "failed", "b": "passed", "c": "passed", "d": "error", "e": "passed", "f": "skipped"}
    assert compare(outcomes, expected) == (["d"], ["c"], ["gone"])


def test_every_mode_runs_every_test_once():
    """Each mode's chunks run its four files, each whole in one chunk, or (the stress test) split by -k
    filters that select each of its 12 parametrizations (vLLM 0.32.0's ids) exactly once."""
    from itertools import product

    from _pytest.mark.expression import Expression

    assert len({(mode, chunk) for mode, chunk, _ in CHUNKS}) == len(CHUNKS)
    blast_ids = [
        f"test_priority_scheduling_blast[{profile}-{spec}-{caching}]"
        for profile, spec, caching in product(("standard", "preemption"), ("None", "1", "5"), ("True", "False"))
    ]
    for mode in MODES:
        runs = [args for run_mode, _, args in CHUNKS if run_mode == mode]
        for file in FILES:
            mine = [args for args in runs if file in args]
            if all("-k" not in args for args in mine):
                assert len(mine) == 1, (mode, file)
                continue
            assert file == BLAST and all("-k" in args for args in mine), (mode, file)
            filters = [Expression.compile(args[args.index("-k") + 1]) for args in mine]
            for test_id in blast_ids:  # pytest's -k: case-insensitive substring match
                hits = sum(f.evaluate(lambda k, name=test_id: k.lower() in name.lower()) for f in filters)
                assert hits == 1, (mode, test_id, hits)
