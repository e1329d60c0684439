"""report: the paper-style tau_b table from metrics/ranking.json, printed and written as markdown
(tables: pipeline.ranking.report_tables)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.ranking.report_tables import render_markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars report", description=__doc__.split("\n")[0])
    parser.add_argument("--ranking", default="metrics/ranking.json", help="evaluate's metrics (default: %(default)s)")
    parser.add_argument("--out", default="metrics/report.md", help="markdown file to write (default: %(default)s)")
    args = parser.parse_args(argv)
    path = Path(args.ranking)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (run `pars evaluate` or `dvc repro evaluate` first)")
    text = render_markdown(json.loads(path.read_text(encoding="utf-8")))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text, end="")
    return 0
