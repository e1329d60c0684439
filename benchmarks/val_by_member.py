"""A cross-model checkpoint's Kendall tau_b on each member's val split. `pars train` reports only
the members' mean (the stage's selection criterion); this shows which model a setting helps or
hurts. Val only: the test split is for evaluate's final figures.

    python benchmarks/val_by_member.py /tmp/exp/a3/models/recorded/pairwise
    python benchmarks/val_by_member.py CKPT --set recorded --data /tmp/clone/data --out /tmp/val.json
    python benchmarks/val_by_member.py CKPT --max-length 256 --head-fraction 0.5   # another view at inference
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.contracts import write_json  # noqa: E402
from pipeline.params import PARAMS_HELP, load_params  # noqa: E402
from pipeline.ranking.checkpoint import CheckpointError  # noqa: E402
from pipeline.ranking.data import RankingData  # noqa: E402
from pipeline.ranking.metrics import kendall_tau_b  # noqa: E402
from pipeline.serving.scorer import Scorer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a checkpoint directory written by pars train")
    ap.add_argument("--set", default="recorded", help="the cross-model set (train.cross_models) it was trained on")
    ap.add_argument("--data", default="data", help="data root holding its members' pairs and the prompts")
    ap.add_argument("--params", default=None, help=PARAMS_HELP)
    ap.add_argument("--out", default=None, help="also write the figures to this JSON file")
    ap.add_argument(
        "--max-length", type=int, default=None, help="score with this many prompt tokens (default: the checkpoint's)"
    )
    ap.add_argument(
        "--head-fraction",
        type=float,
        default=None,
        help="share kept from a long prompt's start (default: the checkpoint's)",
    )
    args = ap.parse_args(argv)
    if args.head_fraction is not None and not 0.0 <= args.head_fraction <= 1.0:
        print(f"val_by_member: --head-fraction {args.head_fraction}: expected a number in [0, 1]", file=sys.stderr)
        return 2

    members = (load_params("train", args.params)["cross_models"] or {}).get(args.set)
    if not members:
        print(f"val_by_member: train.cross_models has no set {args.set!r}", file=sys.stderr)
        return 2
    try:
        data = RankingData.load_union(args.set, list(members), args.data)
        scorer = Scorer.from_pretrained(args.checkpoint)
    except (CheckpointError, OSError, ValueError) as exc:  # a missing or damaged checkpoint or data root
        print(f"val_by_member: {exc}", file=sys.stderr)
        return 2
    if args.max_length is not None:
        # the bound Scorer.from_pretrained puts on a checkpoint's own max_length
        positions = scorer.model.encoder.config.max_position_embeddings
        if not 2 <= args.max_length <= positions:
            print(
                f"val_by_member: --max-length {args.max_length}: expected 2..{positions} (the encoder's positions)",
                file=sys.stderr,
            )
            return 2
        scorer.max_length = args.max_length
    if args.head_fraction is not None:
        scorer.head_fraction = args.head_fraction
    val = data.labels[data.labels["split"] == "val"]
    scores = scorer.score([data.texts[p] for p in val["prompt_id"]])
    by_member = {}
    for group, member in enumerate(members):
        rows = (val["group"] == group).to_numpy()
        by_member[member] = {
            "n_prompts": int(rows.sum()),
            "val_tau_b": round(float(kendall_tau_b(scores[rows], val["length"].to_numpy()[rows])), 4),
        }
    result = {
        "checkpoint": str(args.checkpoint),
        "set": args.set,
        "max_length": scorer.max_length,
        "head_fraction": scorer.head_fraction,
        "members": by_member,
        "mean_val_tau_b": round(statistics.fmean(m["val_tau_b"] for m in by_member.values()), 4),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        write_json(result, Path(args.out))
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
