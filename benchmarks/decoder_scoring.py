"""Scoring speed of a checkpoint with a decoder prior (blend.features: decoder), two ways, side by
side in one process on the same ChatGPT val prompts:

- per batch: the decoder runs on each encoder batch (`Scorer.score_parts`, what the scheduler's
  background worker does: scores arrive batch by batch);
- whole list: `Scorer.score`, which runs the decoder once over the list, batched by its own token
  lengths (what evaluate does).

Prints prompts/s for each and the largest score difference between them (bfloat16 features move a
little with their batch-mates). Val prompts only.

    python benchmarks/decoder_scoring.py models/recorded/pairwise+decoder --n 600
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.contracts import labels_path, prompts_path, write_json  # noqa: E402
from pipeline.ranking.checkpoint import CheckpointError  # noqa: E402
from pipeline.serving.scorer import Scorer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a checkpoint with a decoder prior (the blend stage's <method>+decoder)")
    ap.add_argument("--data", default="data")
    ap.add_argument("--n", type=int, default=600, help="ChatGPT val prompts scored (a seeded draw)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    try:
        scorer = Scorer.from_pretrained(args.checkpoint)
    except CheckpointError as exc:
        print(f"decoder_scoring: {exc}", file=sys.stderr)
        return 2
    if scorer.decoder is None:
        print(f"decoder_scoring: {args.checkpoint} carries no decoder prior", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(2)
    labels = pd.read_parquet(labels_path("chatgpt", args.data))
    prompts = pd.read_parquet(prompts_path(args.data)).set_index("prompt_id")["prompt"]
    val = labels[labels["split"] == "val"]["prompt_id"]
    texts = prompts.loc[val.sample(n=min(args.n, len(val)), random_state=0)].tolist()

    t0 = time.perf_counter()
    per_batch = np.empty(len(texts), dtype=np.float32)
    for rows, scores in scorer.score_parts(texts):
        per_batch[rows] = scores
    t1 = time.perf_counter()
    whole = scorer.score(texts)
    t2 = time.perf_counter()
    figures = {
        "checkpoint": args.checkpoint,
        "prompts": len(texts),
        "per_batch_prompts_per_s": round(len(texts) / (t1 - t0), 2),
        "whole_list_prompts_per_s": round(len(texts) / (t2 - t1), 2),
        "max_abs_score_difference": float(np.abs(per_batch - whole).max()),
        "score_sd": float(whole.std()),
    }
    for key, value in figures.items():
        print(f"{key}: {value}")
    if args.json:
        write_json(figures, Path(args.json))
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
