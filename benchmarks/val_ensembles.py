"""How far rank-averaging the trained predictors (and the TF-IDF + ridge reference) gets on a model's
val split: is a larger ensemble of what the pipeline already trains a way to the ranking target?

Val only (the test split is for final figures). Every predictor under models/<train model>/<method>/
and the TF-IDF + ridge reference (fitted on the train split, its alpha picked on this val split as in
evaluate) score the eval model's val prompts; each subset of them is combined by mean rank.

    python benchmarks/val_ensembles.py                 # ChatGPT's val split (ShareGPT)
    python benchmarks/val_ensembles.py --model gpt-4-turbo

Writes metrics/choices/val_ensembles-<model>.json (every subset's val tau_b, best first).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import pandas as pd
from scipy.stats import rankdata

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.contracts import generations_path, prompts_path  # noqa: E402
from pipeline.params import load_params  # noqa: E402
from pipeline.ranking.labels import prompt_labels  # noqa: E402
from pipeline.ranking.metrics import kendall_tau_b  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="chatgpt", help="eval model whose val answers rank the prompts")
    ap.add_argument(
        "--predictors",
        default="chatgpt/pairwise,chatgpt/pointwise,chatgpt/listwise,recorded/pairwise",
        help="comma-separated <train model>/<method> under models/",
    )
    ap.add_argument("--out", default=None, help="default metrics/choices/val_ensembles-<model>.json")
    args = ap.parse_args(argv)

    from pipeline.evaluate import tfidf_ridge_scores
    from pipeline.serving.scorer import Scorer, score_together

    names = [n.strip() for n in args.predictors.split(",") if n.strip()]
    for path in [prompts_path(), generations_path(args.model)] + [Path("models") / n / "pars.json" for n in names]:
        if not path.is_file():
            sys.exit(f"val_ensembles: {path} not found (run `dvc repro`, or check --model / --predictors)")
    prompts = pd.read_parquet(prompts_path()).drop_duplicates("prompt_id").set_index("prompt_id")
    labels = prompt_labels(pd.read_parquet(generations_path(args.model))).set_index("prompt_id")
    labels = labels.join(prompts[["split", "prompt"]], how="inner", rsuffix="_prompt")
    train, val = labels[labels["split"] == "train"], labels[labels["split"] == "val"]
    lengths = val["length"].to_numpy()

    ref = load_params("evaluate")["tfidf_ridge"]
    tfidf, alpha, _ = tfidf_ridge_scores(
        train["prompt"].tolist(),
        train["length"].to_numpy(),
        val["prompt"].tolist(),
        lengths,
        val["prompt"].tolist(),
        alphas=ref["alphas"],
        ngram_max=ref["ngram_max"],
        min_df=ref["min_df"],
    )
    scores = {f"tfidf_ridge (alpha {alpha:g})": tfidf}
    print(f"val_ensembles: scoring {len(val)} val prompts with models/{{{','.join(names)}}}", flush=True)
    scorers = [Scorer.from_pretrained(Path("models") / name) for name in names]
    scores.update(zip(names, score_together(scorers, val["prompt"].tolist(), progress=True)))
    ranks = {name: rankdata(v) / len(v) for name, v in scores.items()}
    rows = [
        {"members": list(combo), "val_kendall_tau_b": kendall_tau_b(sum(ranks[m] for m in combo), lengths)}
        for n in range(1, len(ranks) + 1)
        for combo in itertools.combinations(ranks, n)
    ]
    rows.sort(key=lambda r: -r["val_kendall_tau_b"])
    out = Path(args.out or f"metrics/choices/val_ensembles-{args.model}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "eval_model": args.model,
                "split": "val",
                "n_prompts": int(len(val)),
                "combination": "mean of ranks",
                "subsets": rows,
            },
            indent=2,
        )
        + "\n"
    )
    for r in rows[:5] + [r for r in rows if len(r["members"]) == 1]:
        print(f"{r['val_kendall_tau_b']:.3f}  {' + '.join(r['members'])}")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
