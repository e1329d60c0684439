"""Evaluate's scoring in float32 and in bfloat16 autocast, side by side, on a model's val split.

    python benchmarks/scoring_precision.py                                   # ChatGPT val
    python benchmarks/scoring_precision.py --json metrics/choices/scoring_precision.json

Loads the predictors the evaluate stage scores (params `evaluate`), scores the val-split prompts
of `--model` with all of them together (`score_together`, as evaluate does) once per precision, and
prints the wall times, the speed-up, each predictor's val tau_b under both, and the tau_b between
its two score lists. Val only: the test split is for evaluate's final figures. Run on idle cores;
bf16-mixed is fast only where bfloat16 is native (AVX512-BF16 / AMX).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402


def main() -> None:
    from pipeline.contracts import predictor_dir, write_json
    from pipeline.hardware import cpu_has_native_bf16
    from pipeline.params import load_params
    from pipeline.ranking.data import RankingData
    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.ranking.predictors import evaluated_predictors
    from pipeline.serving.scorer import Scorer, score_together

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="chatgpt", help="whose val split (data/pairs/<model>) to score")
    parser.add_argument("--data", default="data")
    parser.add_argument("--models-root", default="models")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()

    params = load_params("evaluate")
    data = RankingData.load(args.model, args.data)
    val = data.labels[data.labels["split"] == "val"]
    texts, lengths = [data.texts[p] for p in val["prompt_id"]], val["length"].to_numpy()
    predictors = evaluated_predictors(params)
    runs = {}
    for precision in ("32-true", "bf16-mixed"):
        scorers = [
            Scorer.from_pretrained(predictor_dir(m, meth, Path(args.models_root)), precision=precision)
            for m, meth in predictors
        ]
        start = time.perf_counter()
        scores = score_together(scorers, texts, batch_size=int(params["batch_size"]))
        runs[precision] = {"seconds": time.perf_counter() - start, "scores": scores}
        print(f"{precision}: {len(texts)} prompts x {len(scorers)} predictors in {runs[precision]['seconds']:.1f} s")
    speedup = runs["32-true"]["seconds"] / runs["bf16-mixed"]["seconds"]
    by_predictor = {}
    for i, (m, meth) in enumerate(predictors):
        a, b = runs["32-true"]["scores"][i], runs["bf16-mixed"]["scores"][i]
        row = {
            "val_tau_b_32_true": round(kendall_tau_b(a, lengths), 4),
            "val_tau_b_bf16_mixed": round(kendall_tau_b(b, lengths), 4),
            "tau_b_between": round(kendall_tau_b(a, b), 4),
            "distinct_scores_bf16_mixed": int(len(np.unique(b))),
        }
        by_predictor[f"{m}/{meth}"] = row
        print(f"  {m}/{meth}: {row}")
    print(f"speed-up bf16-mixed / 32-true: {speedup:.2f}x")
    if args.json:
        write_json(
            {
                "question": "can evaluate score its predictors in bfloat16 autocast (as bf16-mixed training "
                "computes) without changing what it measures?",
                "command": "python benchmarks/scoring_precision.py --json <file>",
                "model": args.model,
                "split": "val",
                "n_prompts": len(texts),
                "predictors": len(predictors),
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                f"native bf16: {cpu_has_native_bf16()}",
                "seconds": {k: round(v["seconds"], 1) for k, v in runs.items()},
                "speedup": round(speedup, 2),
                "by_predictor": by_predictor,
            },
            Path(args.json),
        )


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
