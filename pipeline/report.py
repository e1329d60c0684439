"""report: the results page, metrics/report.md, generated from the metrics files so it cannot go stale.

The paper-style tau_b tables from metrics/ranking.json (pipeline.ranking.report_tables), then the
serving results: simulator workloads, the real-engine burst, the scheduler stall and capacity, and
what a cold `dvc repro` and training cost (pipeline.serving.results), each from its own metrics file
when it exists."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.contracts import read_json, same_file
from pipeline.errors import PARSError
from pipeline.ranking.report_tables import render_markdown
from pipeline.serving.results import render_serving

REPORT = "metrics/report.md"  # the report stage's output
RESULT_FILES = {
    "simulation": "metrics/simulation.json",
    "engine_bench": "metrics/engine_bench.json",
    "scheduler_overhead": "metrics/scheduler_overhead.json",
    "sim_fidelity": "metrics/sim_fidelity.json",
    "capacity": "metrics/capacity.json",
    "cold_repro": "metrics/cold_repro.json",
    "train_throughput": "metrics/train_throughput.json",
}
# noise ceilings of models with one recorded answer per prompt, estimated by a benchmark
ESTIMATED_CEILINGS = ("metrics/choices/chatgpt_noise_ceiling.json",)
# what a damaged metrics file raises deep in the renderers (a missing key, a list for a mapping)
DAMAGED = (KeyError, IndexError, TypeError, AttributeError, ValueError)


def _render(render, path: str | Path, *args):
    """render(*args), or one line naming the metrics file that is not as its stage writes it."""
    try:
        return render(*args)
    except DAMAGED as exc:  # chained: `pars --debug report` shows where it broke (a damaged file, or a bug)
        raise PARSError(
            f"{path}: not as its stage writes it ({type(exc).__name__}: {exc}); rerun that stage "
            f"(or, if it is current, `pars --debug report` shows the traceback)"
        ) from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars report", description=__doc__.split("\n")[0])
    parser.add_argument("--ranking", default="metrics/ranking.json", help="evaluate's metrics (default: %(default)s)")
    parser.add_argument(
        "--out", help=f"markdown file to write (default: {REPORT}; with --ranking-only, none: printed only)"
    )
    parser.add_argument("--ranking-only", action="store_true", help="leave out the serving sections")
    args = parser.parse_args(argv)
    from pipeline.contracts import ensure_parent, write_text

    # a ranking-only page must not replace the report stage's full page unless asked to
    out = args.out
    if out is None and not args.ranking_only:
        out = REPORT
    path = Path(args.ranking)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (run `pars evaluate` or `dvc repro evaluate` first)")
    if out is not None:
        # the page written over a metrics file it reads (or would read, once its stage runs) loses it
        inputs = [("the --ranking file", path)] + [
            ("the input", f) for f in (*ESTIMATED_CEILINGS, *RESULT_FILES.values())
        ]
        for what, f in inputs:
            if same_file(out, f):
                raise PARSError(f"--out {out}: is {what} {f}; the page would replace it")
        # a file in the way: one line, before any work; the directory is made only when the page is written
        ensure_parent(out, create=False)
    # every file read (and its JSON checked) before anything is rendered
    ranking = read_json(path)
    ceiling_files = [f for f in ESTIMATED_CEILINGS if Path(f).is_file()]
    ceilings = [read_json(f) for f in ceiling_files]
    serving = {}
    if not args.ranking_only:
        serving = {key: read_json(f) if Path(f).is_file() else None for key, f in RESULT_FILES.items()}
    for key in ("predictors", "references"):
        if not isinstance(ranking.get(key), dict):
            problem = "has no" if key not in ranking else "has a non-mapping"
            raise PARSError(f"{path}: {problem} {key!r} (evaluate writes it; rerun `pars evaluate`)")
    for f, ceiling in zip(ceiling_files, ceilings):
        # every key the tables read, so a missing one is named here, not blamed on the ranking file
        missing = [k for k in ("model", "dataset", "noise_ceiling", "what", "command") if k not in ceiling]
        stat = ceiling.get("noise_ceiling")
        missing += [
            f"noise_ceiling.{k}"
            for k in ("kendall_tau_b", "ci_low", "ci_high", "n_prompts")
            if not isinstance(stat, dict) or k not in stat
        ]
        if missing:
            raise PARSError(f"{f}: has no {missing[0]!r} (rerun the benchmark that writes it)")
    text = _render(render_markdown, path, ranking, ceilings)
    if not args.ranking_only:
        for key, data in serving.items():  # each file on its own, so a damaged one is named
            if data is not None:
                _render(render_serving, RESULT_FILES[key], {key: data})
        text = text.rstrip() + "\n\n" + render_serving(serving)
    if out is not None:
        write_text(text, out)
    print(text, end="")
    return 0
