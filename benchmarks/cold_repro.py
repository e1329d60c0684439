"""Wall time of a cold `dvc repro`: the whole pipeline from a fresh clone, stage by stage.

    python benchmarks/cold_repro.py                       # clone HEAD to a temp dir, dvc repro, time it
    python benchmarks/cold_repro.py --json metrics/cold_repro.json

A fresh `git clone` has no DVC cache and no data, so every stage whose outputs DVC caches runs
(nothing is restored from a run cache); a stage whose outputs are in git and whose deps did not
change is skipped, as on any fresh clone, and listed as skipped. The clone uses this checkout's
`.venv` and runs its own code (HEAD's, not uncommitted edits). Run it on idle cores: it takes most
of an hour on 2 cores. Prints and writes the seconds of every stage and the total.
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

STAGE_LINE = re.compile(r"^Running stage '([^']+)'")
SKIPPED_LINE = re.compile(r"^Stage '([^']+)' didn't change, skipping")


def stage_seconds(events: list[tuple[float, str]], end: float) -> dict[str, float]:
    """Seconds per stage from (time, line) events: a stage lasts until the next one starts."""
    starts = [(t, m.group(1)) for t, line in events if (m := STAGE_LINE.match(line.strip()))]
    return {
        name: round((starts[i + 1][0] if i + 1 < len(starts) else end) - t, 1) for i, (t, name) in enumerate(starts)
    }


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
    out = {
        "commit": commit.stdout.strip(),
        "total_s": round(total, 1),
        "stages_s": stage_seconds(events, total),
        "skipped": [m.group(1) for _, line in events if (m := SKIPPED_LINE.match(line.strip()))],
    }
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
