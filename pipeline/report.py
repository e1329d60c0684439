"""report: the results page, metrics/report.md, generated from the metrics files so it cannot go stale.

The paper-style tau_b tables from metrics/ranking.json (pipeline.ranking.report_tables), then the
serving results: simulator workloads, the real-engine burst, the scheduler stall and capacity
(pipeline.serving.results), each from its own metrics file when it exists."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.ranking.report_tables import render_markdown
from pipeline.serving.results import render_serving

SERVING_FILES = {
    "simulation": "metrics/simulation.json",
    "engine_bench": "metrics/engine_bench.json",
    "scheduler_overhead": "metrics/scheduler_overhead.json",
    "sim_fidelity": "metrics/sim_fidelity.json",
    "capacity": "metrics/capacity.json",
}
# noise ceilings of models with one recorded answer per prompt, estimated by a benchmark
ESTIMATED_CEILINGS = ("metrics/choices/chatgpt_noise_ceiling.json",)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars report", description=__doc__.split("\n")[0])
    parser.add_argument("--ranking", default="metrics/ranking.json", help="evaluate's metrics (default: %(default)s)")
    parser.add_argument("--out", default="metrics/report.md", help="markdown file to write (default: %(default)s)")
    parser.add_argument("--ranking-only", action="store_true", help="leave out the serving sections")
    args = parser.parse_args(argv)
    from pipeline.contracts import ensure_parent

    ensure_parent(args.out)  # a file in the way: one line, before any work
    path = Path(args.ranking)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (run `pars evaluate` or `dvc repro evaluate` first)")
    ceilings = [json.loads(Path(f).read_text(encoding="utf-8")) for f in ESTIMATED_CEILINGS if Path(f).is_file()]
    text = render_markdown(json.loads(path.read_text(encoding="utf-8")), ceilings)
    if not args.ranking_only:
        serving = {
            key: json.loads(Path(f).read_text(encoding="utf-8")) if Path(f).is_file() else None
            for key, f in SERVING_FILES.items()
        }
        text = text.rstrip() + "\n\n" + render_serving(serving)
    ensure_parent(args.out).write_text(text, encoding="utf-8")
    print(text, end="")
    return 0
