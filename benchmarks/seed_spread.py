"""How much a predictor's ranking quality moves with the training seed alone: the same `pars train`
run with several seeds, each checkpoint's Kendall tau_b on every eval model's val and test splits.
A spread measurement, not a choice: nothing is selected by it, so scoring the test split is fair.

    python benchmarks/seed_spread.py                      # the default export: recorded/pairwise
    python benchmarks/seed_spread.py --model chatgpt --method pointwise --seeds 42 1 2 3

Checkpoints go to <work>/seed<s>/<model>/<method>/, the whole train section that produced each
beside it (<method>.train.json: the checkpoint's pars.json records only some of it); one already
there trained with the train section asked for now is scored, not retrained (an interrupted run
resumes). Writes --out (default metrics/choices/seed_spread-<model>-<method>.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.contracts import generations_path, prompts_path, write_json  # noqa: E402
from pipeline.params import load_params  # noqa: E402
from pipeline.ranking.checkpoint import CheckpointError, read_meta  # noqa: E402
from pipeline.ranking.labels import prompt_labels  # noqa: E402
from pipeline.ranking.metrics import kendall_tau_b  # noqa: E402

# train keys that cannot change the weights: where the run logs
NOT_SETTINGS = ("wandb",)


def settings_path(ckpt: Path) -> Path:
    """Where the train section that produced `ckpt` is kept: beside it, <method>.train.json."""
    return ckpt.with_name(f"{ckpt.name}.train.json")


def settings(cfg: dict) -> dict:
    """The train section as stored and compared (JSON round trip: tuples and lists alike)."""
    return json.loads(json.dumps({k: v for k, v in cfg.items() if k not in NOT_SETTINGS}, sort_keys=True, default=str))


def stale(ckpt: Path, cfg: dict) -> bool:
    """A checkpoint that is missing, incomplete (an interrupted write), or trained with another train
    section than `cfg` (all of it: the copy this script stored beside the checkpoint; none stored, as
    for a checkpoint from before it stored one: retrained) is retrained, not scored."""
    try:
        meta = read_meta(ckpt)
    except CheckpointError:
        return True
    # the checkpoint's own record too: the stored copy must describe this checkpoint
    recorded = {**meta.get("training", {}), "max_length": meta.get("max_length"), "encoder": meta.get("encoder")}
    if any(recorded.get(k) != cfg.get(k) for k in recorded):
        return True
    try:
        stored = json.loads(settings_path(ckpt).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    return stored != settings(cfg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="recorded", help="train model or cross-model set")
    ap.add_argument("--method", default="pairwise")
    ap.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    ap.add_argument("--eval-models", default=None, help="comma-separated; default evaluate.eval_models")
    ap.add_argument("--work", default="/tmp/seed_spread", help="where the checkpoints go")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    train = load_params("train")
    eval_models = (args.eval_models or ",".join(load_params("evaluate")["eval_models"])).split(",")
    eval_models = [m.strip() for m in eval_models if m.strip()]
    for m in eval_models:
        if not generations_path(m).is_file():
            raise SystemExit(f"seed_spread: {generations_path(m)} not found (run `dvc repro`, or check --eval-models)")

    from pipeline.serving.scorer import Scorer
    from pipeline.train import train_one

    prompts = pd.read_parquet(prompts_path()).drop_duplicates("prompt_id").set_index("prompt_id")
    splits = {}
    for m in eval_models:
        labels = prompt_labels(pd.read_parquet(generations_path(m))).set_index("prompt_id")
        labels = labels.join(prompts[["split", "prompt"]], how="inner")
        splits[m] = {s: labels[labels["split"] == s] for s in ("val", "test")}

    taus: dict[str, dict[str, dict[str, float]]] = {}
    for seed in args.seeds:
        root = Path(args.work) / f"seed{seed}"
        ckpt = root / args.model / args.method
        cfg = {**train, "seed": seed}
        if stale(ckpt, cfg):
            print(f"seed_spread: training {args.model}/{args.method} with seed {seed}", flush=True)
            asked = settings(cfg)  # before training, which must not change what is recorded
            settings_path(ckpt).unlink(missing_ok=True)  # written again once the checkpoint is
            train_one(
                args.model,
                args.method,
                cfg,
                models_root=root,
                metrics_dir=root / "metrics",
                plots_dir=root / "plots",
            )
            write_json(asked, settings_path(ckpt))
        scorer = Scorer.from_pretrained(ckpt)
        for m, parts in splits.items():
            for split, part in parts.items():
                tau = kendall_tau_b(scorer.score(part["prompt"].tolist()), part["length"].to_numpy())
                taus.setdefault(m, {}).setdefault(split, {})[str(seed)] = round(float(tau), 4)
            print(f"seed {seed}: {m} val {taus[m]['val'][str(seed)]:.3f} test {taus[m]['test'][str(seed)]:.3f}")

    summary = {
        m: {
            split: {
                "n_prompts": int(len(splits[m][split])),
                "by_seed": by_seed,
                "mean": round(statistics.mean(by_seed.values()), 4),
                "sd": round(statistics.stdev(by_seed.values()), 4) if len(by_seed) > 1 else None,
                "range": [min(by_seed.values()), max(by_seed.values())],
            }
            for split, by_seed in per_split.items()
        }
        for m, per_split in taus.items()
    }
    out = Path(args.out or f"metrics/choices/seed_spread-{args.model}-{args.method}.json")
    write_json(
        {
            "predictor": f"{args.model}/{args.method}",
            "seeds": args.seeds,
            "setting": "params.yaml's train section, only train.seed differs",
            "command": " ".join(["python benchmarks/seed_spread.py", *(argv if argv is not None else sys.argv[1:])]),
            "kendall_tau_b": summary,
        },
        out,
    )
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
