"""In-batch versus per-pair pairwise training, side by side, on the default encoder.

Both modes train a fresh copy of the same encoder for the same number of steps, each step
encoding the same number of prompts (in-batch: `batch_size` distinct prompts and every δ-valid
pair among them; per-pair: `batch_size / 2` rows of train.parquet, both prompts encoded), with the
same loss, optimiser and schedule. Prints training throughput (pairs/s, prompts encoded/s) and
the val tau_b / pair accuracy each reaches.

    python benchmarks/train_throughput.py --model gpt-4-turbo --steps 40

Needs data/pairs/<model>/ (`dvc repro pairs@<model>`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run_mode(mode: str, args, data, tokenizer) -> dict:
    import lightning as L

    from pipeline.ranking.data import RankingDataModule
    from pipeline.ranking.lightning import RankerModule, prepare_for_training
    from pipeline.ranking.model import LengthRanker

    L.seed_everything(args.seed, workers=True, verbose=False)
    batch = args.batch_size if mode == "in_batch" else max(1, args.batch_size // 2)
    dm = RankingDataModule(data, tokenizer, "pairwise", max_length=args.max_length, batch_size=batch,
                           eval_batch_size=64, pairwise_mode=mode, seed=args.seed)
    model = LengthRanker.from_pretrained_encoder(args.encoder)
    prepare_for_training(model, "pairwise", [])
    model.train()
    module = RankerModule(model, "pairwise", lr=args.lr, val_pairs=dm.val_pair_idx)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, precision="32-true",
                        gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
                        limit_val_batches=0, num_sanity_val_steps=0, enable_model_summary=False,
                        enable_progress_bar=not args.quiet)
    trainer.fit(module, datamodule=dm)
    val_trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False)
    val_trainer.validate(module, datamodule=dm, verbose=False)
    secs = module.train_seconds
    return {"mode": mode, "batch": batch, "steps": int(trainer.global_step),
            "prompts_encoded": module.prompts_encoded, "pairs": module.pairs_seen, "train_s": round(secs, 1),
            "prompts_per_s": round(module.prompts_encoded / secs, 2), "pairs_per_s": round(module.pairs_seen / secs, 2),
            "pairs_per_prompt": round(module.pairs_seen / max(1, module.prompts_encoded), 2),  # load-independent
            "val_tau_b": round(module.last_val["val_tau_b"], 4), "val_pair_acc": round(module.last_val["val_pair_acc"], 4),
            "n_val_prompts": module.last_val["n_val_prompts"]}


def warm_up(args, tokenizer) -> None:
    """One untimed forward/backward, so the first mode measured does not pay torch's first-call costs."""
    from pipeline.ranking.model import LengthRanker

    model = LengthRanker.from_pretrained_encoder(args.encoder)
    enc = tokenizer(["warm up"] * args.batch_size, padding="max_length", max_length=args.max_length,
                    truncation=True, return_tensors="pt")
    model(enc["input_ids"], enc["attention_mask"]).sum().backward()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt-4-turbo", help="generation model whose pairs to use")
    ap.add_argument("--data", default="data")
    ap.add_argument("--encoder", default="minilm-l6")
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16, help="prompts encoded per step, both modes")
    ap.add_argument("--steps", type=int, default=40, help="optimiser steps per mode")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    import torch

    from pipeline.ranking.data import RankingData
    from pipeline.ranking.model import load_tokenizer

    torch.set_num_threads(args.threads)
    data = RankingData.load(args.model, args.data)
    tokenizer = load_tokenizer(args.encoder)
    warm_up(args, tokenizer)
    t0 = time.perf_counter()
    rows = [run_mode(mode, args, data, tokenizer) for mode in ("in_batch", "per_pair")]
    cols = ["mode", "batch", "steps", "prompts_encoded", "pairs", "train_s", "prompts_per_s", "pairs_per_s",
            "pairs_per_prompt", "val_tau_b", "val_pair_acc"]
    print(f"\npairwise training on {args.model} pairs, encoder {args.encoder}, max_length {args.max_length}, "
          f"{args.batch_size} prompts encoded per step, {args.steps} steps, {torch.get_num_threads()} threads "
          f"(val: {rows[0]['n_val_prompts']} prompts)")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    ratio = rows[0]["pairs_per_s"] / rows[1]["pairs_per_s"] if rows[1]["pairs_per_s"] else float("inf")
    print(f"in-batch / per-pair pairs per second: {ratio:.1f}x; total {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "results": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
