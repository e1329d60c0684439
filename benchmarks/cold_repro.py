"""Wall time of a cold `dvc repro`: the whole pipeline from a fresh clone, stage by stage.

    python benchmarks/cold_repro.py                       # clone HEAD to a temp dir, dvc repro, time it
    python benchmarks/cold_repro.py --json metrics/cold_repro.json

A fresh `git clone` has no DVC cache and no data, so every stage whose outputs DVC caches runs
(nothing should be restored from a run cache: a stage that is, say through a shared cache dir, is
listed under `restored_s` with its checkout seconds, not under `stages_s`, and `cold` is false); a
stage whose outputs are in git and whose deps did not change is skipped, as on any fresh clone, and
listed under `skipped`. benchmarks/engine_bench.py is no stage: its committed JSON is a dep, its run
time not in the total (`not_in_repro`). A DVC stage line of no known kind fails the run once the
JSON is printed (--json not written). The clone uses this checkout's `.venv` and runs its own code
(HEAD's, not uncommitted edits). Run it on idle cores: it takes most of an hour on 2 cores. Prints
and writes the seconds of every stage and the total.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# DVC 3's stage lines (dvc/stage/run.py, dvc/stage/__init__.py, dvc/stage/cache.py)
STAGE_LINE = re.compile(r"^Running stage '([^']+)'")
# a stage (or a .dvc data source, without "Stage ") whose deps and outs did not change: outputs in git
SKIPPED_LINE = re.compile(r"^(?:Stage )?'([^']+)' didn't change, skipping")
# outputs restored from DVC's run cache instead of running the command: not a cold run of that stage
RESTORED_LINE = re.compile(r"^Stage '([^']+)' is cached - skipping run")
# any other "Stage 'x' ..." line: a DVC message this script does not know; it ends the stage before
# it (whose time it would otherwise swell) and fails the run once the JSON is printed
OTHER_STAGE_LINE = re.compile(r"^(Stage '[^']+' .*)$")
KINDS = (
    ("ran", STAGE_LINE),
    ("skipped", SKIPPED_LINE),
    ("restored", RESTORED_LINE),
    ("unrecognised", OTHER_STAGE_LINE),
)
SKIPPED_WHY = (
    "`Stage 'x' didn't change, skipping`: deps, params and outputs as dvc.lock records them; outputs DVC "
    "does not cache (cache: false) are in git, so a fresh clone has them and does not run the stage"
)
NOT_IN_REPRO = {
    "benchmarks/engine_bench.py": "not a DVC stage (minutes of vLLM per policy): its metrics/engine_bench.json "
    "and metrics/engine_bench_fit.json are committed and read as deps (sim_fidelity, report); its run time is "
    "not in total_s",
}


def stage_events(events: list[tuple[float, str]]) -> list[tuple[float, str, str]]:
    """(time, kind, stage) of every stage line: kind ran, skipped, restored, or unrecognised (then
    the whole line in place of the stage)."""
    out = []
    for t, line in events:
        text = line.strip()
        for kind, pattern in KINDS:
            if m := pattern.match(text):
                out.append((t, kind, m.group(1)))
                break
    return out


def stage_seconds(events: list[tuple[float, str]], end: float, kind: str = "ran") -> dict[str, float]:
    """Seconds per stage of one kind (ran: its command; restored: its run-cache checkout) from
    (time, line) events: a stage lasts until the next stage line of any kind (or `end`)."""
    marks = stage_events(events)
    return {
        name: round((marks[i + 1][0] if i + 1 < len(marks) else end) - t, 1)
        for i, (t, k, name) in enumerate(marks)
        if k == kind
    }


def summary(events: list[tuple[float, str]], total: float) -> dict:
    """The JSON's stage fields: seconds of the stages that ran, those skipped and why, those
    restored from a run cache (then the run was not cold: `cold` false), and any stage line of a
    kind this script does not know (`unrecognised`, only when there is one)."""
    marks = stage_events(events)
    restored = stage_seconds(events, total, "restored")
    out = {
        "stages_s": stage_seconds(events, total, "ran"),
        "skipped": [name for _, kind, name in marks if kind == "skipped"],
        "skipped_why": SKIPPED_WHY,
        "restored_s": restored,
        "cold": not restored,
        "not_in_repro": NOT_IN_REPRO,
    }
    unknown = [name for _, kind, name in marks if kind == "unrecognised"]
    if unknown:
        out["unrecognised"] = unknown
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=".", help="the checkout to clone (its HEAD) and whose .venv to use")
    parser.add_argument("--workdir", default=None, help="the folder for the temp dir of the clone (removed after)")
    parser.add_argument(
        "--keep",
        default=None,
        help="clone into this new folder and keep it (its DVC cache can restore the same stages elsewhere)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    repo = Path(args.repo).resolve()
    venv = repo / ".venv"
    if not (venv / "bin" / "dvc").exists():
        raise SystemExit(f"--repo {repo}: no .venv/bin/dvc (run scripts/setup.sh first)")
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    if args.keep and Path(args.keep).exists():
        raise SystemExit(f"--keep {args.keep}: already exists")
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        clone = Path(args.keep).resolve() if args.keep else Path(tmp) / "clone"
        if subprocess.run(["git", "clone", "-q", str(repo), str(clone)]).returncode:
            raise SystemExit(f"git clone of {repo} into {clone} failed")
        (clone / ".venv").symlink_to(venv)
        # PYTHONPATH: the stages import the clone's own `pipeline`, not the editable install's
        env = {
            **os.environ,
            "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
            "VIRTUAL_ENV": str(venv),
            "PYTHONPATH": str(clone),
        }
        t0 = time.time()
        events: list[tuple[float, str]] = []
        proc = subprocess.Popen(
            ["dvc", "repro"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in proc.stdout:  # stage lines are timed as they arrive; the rest is echoed
            events.append((time.time() - t0, line))
            sys.stdout.write(line)
        rc = proc.wait()
        total = time.time() - t0
    if rc:
        raise SystemExit(f"dvc repro failed (exit {rc}) after {total:.0f} s")
    out = {"commit": commit.stdout.strip(), "total_s": round(total, 1), **summary(events, total)}
    print(json.dumps(out, indent=2))
    if "unrecognised" in out:
        raise SystemExit(
            f"cold_repro: {len(out['unrecognised'])} dvc stage line(s) of no known kind (their time is not "
            f"attributed; --json not written; update the patterns): {out['unrecognised'][0]!r}"
        )
    if out["restored_s"]:
        print(
            f"cold_repro: WARNING: {len(out['restored_s'])} stage(s) restored from a run cache, not run "
            f"(cold: false): {', '.join(out['restored_s'])}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
