"""Evaluate's scoring, side by side: each predictor on its own against all of them in one pass.

    python benchmarks/evaluate_scoring.py                      # evaluate's predictors, 600 prompts
    python benchmarks/evaluate_scoring.py --json metrics/evaluate_scoring.json

Loads the predictors the evaluate stage scores (params `evaluate`: train_models x methods, and the
cross-model ones), then scores the same test prompts twice in one run: one `Scorer.score` pass per
predictor (what evaluate did before), and `score_together` (the frozen lower layers the
predictors share run once per batch). Prints both wall times, the speed-up and the largest score
difference between the two. Run it on idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=600, help="test prompts scored (seeded sample)")
    parser.add_argument("--prompts-file", default="data/prompts/prompts.parquet")
    parser.add_argument("--models-root", default="models")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import pandas as pd

    from pipeline.contracts import predictor_dir
    from pipeline.params import load_params
    from pipeline.ranking.predictors import evaluated_predictors
    from pipeline.serving.scorer import Scorer, score_together, share_groups

    params = load_params("evaluate")
    paths = [predictor_dir(m, k, Path(args.models_root)) for m, k in evaluated_predictors(params)]
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        raise SystemExit(f"no predictor at {missing[0]} (run `dvc repro train train_cross` first)")
    scorers = [Scorer.from_pretrained(p, batch_size=int(params["batch_size"])) for p in paths]
    prompts = pd.read_parquet(args.prompts_file)
    test = prompts[prompts["split"] == "test"]
    texts = test.sample(min(args.prompts, len(test)), random_state=args.seed)["prompt"].tolist()
    if not texts:
        raise SystemExit(f"--prompts {args.prompts}: no test prompts to score in {args.prompts_file}")
    score_together(scorers, texts[:8])  # warm-up of both paths (first-call costs), not timed

    t0 = time.perf_counter()
    separate = [s.score(texts) for s in scorers]
    separate_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    together = score_together(scorers, texts)
    together_s = time.perf_counter() - t0
    groups = share_groups(scorers, [s.encode(texts) for s in scorers])
    out = {
        "predictors": len(scorers),
        "prompts": len(texts),
        "groups": [{"members": len(m), "shared_layers": n} for m, n in groups],
        "separate_s": round(separate_s, 2),
        "together_s": round(together_s, 2),
        "speedup": round(separate_s / together_s, 2),
        "max_abs_score_difference": float(max(np.abs(a - b).max() for a, b in zip(separate, together))),
        "load_average": os.getloadavg(),
    }
    for key, value in out.items():
        print(f"{key:>26}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
