"""The int8 scorer against the float one: scoring speed on one thread, and val tau_b per model.

    python benchmarks/scorer_int8.py --json metrics/choices/scorer_int8.json

Scores every recorded model's val-split prompts (never test) with the exported checkpoint, float
and `quantize="int8"` (per-channel dynamic int8 Linear layers in the encoder, the head float), on
one torch thread as the serving scorer runs, and prints seconds, the speed-up, each model's val
tau_b both ways, and tau_b between the two score lists.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="models/export/pars-recorded")
    parser.add_argument("--models", default="chatgpt,gpt-4-turbo,gemini-2-flash,o3-mini")
    parser.add_argument("--prompts-file", default="data/prompts/prompts.parquet")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import pandas as pd
    import torch

    from pipeline.contracts import generations_path
    from pipeline.ranking.labels import prompt_labels
    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.serving.scorer import Scorer

    torch.set_num_threads(args.threads)
    if not Path(args.checkpoint).is_dir():
        raise SystemExit(f"--checkpoint {args.checkpoint}: no such checkpoint (run `dvc repro export` first)")
    for model in args.models.split(","):
        if not generations_path(model).is_file():
            raise SystemExit(f"--models: no {generations_path(model)} (run `dvc repro generate`)")
    prompts = pd.read_parquet(args.prompts_file)
    val = prompts[prompts["split"] == "val"].set_index("prompt_id")
    scorers = {q: Scorer.from_pretrained(args.checkpoint, quantize=q) for q in ("none", "int8")}
    out = {"checkpoint": args.checkpoint, "split": "val (the test split was not used)", "threads": args.threads}
    for scorer in scorers.values():  # warm-up (first-call costs), not timed
        scorer.score(val["prompt"].head(8).tolist())
    seconds = {q: 0.0 for q in scorers}
    per_model = {}
    for model in args.models.split(","):
        # the pairs stage's labels: mean output_tokens over a prompt's samples
        lengths = prompt_labels(pd.read_parquet(generations_path(model))).set_index("prompt_id")["length"]
        ids = [pid for pid in lengths.index if pid in val.index]
        texts, truth = val.loc[ids, "prompt"].tolist(), lengths.loc[ids].to_numpy()
        scores = {}
        for q, scorer in scorers.items():
            t0 = time.perf_counter()
            scores[q] = scorer.score(texts)
            seconds[q] += time.perf_counter() - t0
        per_model[model] = {
            "val_prompts": len(ids),
            "tau_b_float": round(kendall_tau_b(scores["none"], truth), 4),
            "tau_b_int8": round(kendall_tau_b(scores["int8"], truth), 4),
            "tau_b_float_vs_int8": round(kendall_tau_b(scores["none"], scores["int8"]), 4),
        }
        print(model, per_model[model], flush=True)
    out.update(
        {
            "seconds_float": round(seconds["none"], 1),
            "seconds_int8": round(seconds["int8"], 1),
            "speedup": round(seconds["none"] / seconds["int8"], 2),
            "models": per_model,
        }
    )
    print(json.dumps({k: v for k, v in out.items() if k != "models"}))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
