"""Pairwise training configurations of the length ranker, side by side, on one model's pairs.

Every configuration trains a fresh copy of the same encoder on the same data (the same seeded
subset of at most `--max-train-prompts` train prompts) for the same number of optimiser steps, with
the same batch size, lr, max_length, head_fraction, loss and schedule, then is validated on the
whole val split:

- `full`             every layer trains, plain shuffle, in-batch pairs (the pipeline before the
                     speed features)
- `full+buckets`     the same, batches of similar prompt length (`length_buckets`)
- `frozen<k>+buckets` embeddings + the lower k layers frozen (`--frozen-layers`, default 3): their
                     output is computed once for all train + val prompts (`cache_s`), each step runs
                     only the top layers; length buckets
- `frozen<k>+buckets+bf16` the same in bfloat16 mixed precision (`train.lightning.precision:
                     bf16-mixed`: CPU autocast; native on AVX512-BF16 / AMX CPUs), cache included
- `frozen<k>+buckets+bf16+all_positions` the same with the last layer run at every position: the
                     training code before [CLS] pooling computed that layer at the first position alone
- `frozen<k>+buckets+bf16+torch_dropout` the default with torch's own dropout masks instead of the
                     cheap CPU ones (pipeline.ranking.dropout; every other configuration uses those,
                     as pipeline/train.py does)
- `frozen<k>+buckets+bf16+adamw_loop` the default with torch's per-parameter AdamW loop instead of
                     its fused AdamW (pipeline.ranking.lightning: fused wherever no GradScaler runs)
- `frozen<k>+shuffle` frozen as above, random batches (`length_buckets: 1`): in-batch pairs join
                     prompts of any size, each batch padded to its longest prompt
- `frozen<k>+micro<m>` the same random batches, each padded in m length-sorted parts
                     (`micro_batches`; `--micro-batches` a comma list of m, default 4) and scored as one batch
- `frozen<k>+shuffle+bf16`, `frozen<k>+micro<m>+bf16` the same two in bfloat16 mixed precision, as
                     `precision: auto` trains them where bfloat16 is native
- `frozen<k>+micro<m>+pad<p>`, `frozen<k>+micro<m>+bf16+pad<p>` the same with every part's width
                     rounded up to a multiple of p (`--pad-to-multiple-of`, default 16; at most
                     `--max-length`): `pad_to_multiple_of`, the pipeline's default. oneDNN compiles a
                     bfloat16 matmul kernel for each new input shape, and widths taking every value
                     up to max_length compile more than they compute
- `per_pair`         the paper's batches: `batch_size / 2` rows of train.parquet per step, both
                     prompts encoded (the same number of encodings per step), full fine-tuning

Prints a markdown table: throughput of the timed training steps (prompts encoded/s, pairs/s; data
loading and validation excluded), the cache pass, `epoch_s_est` = cache_s + the encodings of one
epoch / prompts_per_s (an in-batch epoch encodes every train prompt once, a per-pair epoch both
prompts of every train pair), and the val tau_b / pair accuracy each reaches; then the speed-ups
relative to `full`.

    python benchmarks/train_throughput.py --model chatgpt --steps 60
    python benchmarks/train_throughput.py --configs full,frozen3+buckets --json /tmp/train_bench.json
    python benchmarks/train_throughput.py --configs frozen3+buckets+bf16,frozen3+buckets+bf16+adamw_loop --repeats 4

Needs data/pairs/<model>/ (`dvc repro pairs@<model>`). Run it on idle cores: the numbers are
wall-clock rates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

COLUMNS = [
    "config",
    "steps",
    "prompts_encoded",
    "pairs",
    "train_s",
    "prompts_per_s",
    "pairs_per_s",
    "cache_s",
    "epoch_s_est",
    "val_tau_b",
    "val_pair_acc",
]


def configurations(args) -> dict[str, dict]:
    """Name -> settings of every configuration this command line can run (in table order)."""
    buckets, k = args.length_buckets, args.frozen_layers
    fp32, bf16 = {"precision": "32-true"}, {"precision": "bf16-mixed"}
    return {
        "full": {"pairwise_mode": "in_batch", "frozen_layers": 0, "length_buckets": 0, **fp32},
        "full+buckets": {"pairwise_mode": "in_batch", "frozen_layers": 0, "length_buckets": buckets, **fp32},
        f"frozen{k}+buckets": {"pairwise_mode": "in_batch", "frozen_layers": k, "length_buckets": buckets, **fp32},
        f"frozen{k}+buckets+bf16": {"pairwise_mode": "in_batch", "frozen_layers": k, "length_buckets": buckets, **bf16},
        # the same with the last layer computed at every position (as before the [CLS]-only last layer)
        f"frozen{k}+buckets+bf16+all_positions": {
            "pairwise_mode": "in_batch",
            "frozen_layers": k,
            "length_buckets": buckets,
            "last_layer_all_positions": True,
            **bf16,
        },
        f"frozen{k}+buckets+bf16+torch_dropout": {
            "pairwise_mode": "in_batch",
            "frozen_layers": k,
            "length_buckets": buckets,
            "torch_dropout": True,
            **bf16,
        },
        f"frozen{k}+buckets+bf16+adamw_loop": {
            "pairwise_mode": "in_batch",
            "frozen_layers": k,
            "length_buckets": buckets,
            "adamw_loop": True,
            **bf16,
        },
        # random batches padded at once, or in m parts (the default, `micro_batches`); +bf16: as
        # `precision: auto` trains them where bfloat16 is native
        **{
            f"frozen{k}+shuffle{tag}": {"pairwise_mode": "in_batch", "frozen_layers": k, "length_buckets": 1, **prec}
            for tag, prec in (("", fp32), ("+bf16", bf16))
        },
        # +pad<p>: every part's width rounded up to a multiple of p (`pad_to_multiple_of`, the
        # default train section): oneDNN compiles a bfloat16 matmul kernel per shape
        **{
            f"frozen{k}+micro{m}{tag}" + (f"+pad{p}" if p > 1 else ""): {
                "pairwise_mode": "in_batch",
                "frozen_layers": k,
                "length_buckets": 1,
                "micro_batches": m,
                "pad_to_multiple_of": p,
                **prec,
            }
            for p in (1, args.pad_to_multiple_of)
            for tag, prec in (("", fp32), ("+bf16", bf16))
            for m in args.micro_batches
        },
        "per_pair": {"pairwise_mode": "per_pair", "frozen_layers": 0, "length_buckets": 0, **fp32},
    }


def run_config(name: str, cfg: dict, args, data, tokenizer) -> dict:
    """Train one configuration for `args.steps` steps, validate it, return its table row."""
    import lightning as L

    from pipeline.ranking.data import RankingDataModule
    from pipeline.ranking.dropout import fast_dropout
    from pipeline.ranking.lightning import RankerModule, prepare_for_training
    from pipeline.ranking.model import LengthRanker

    L.seed_everything(args.seed, workers=True, verbose=False)
    mode, frozen = cfg["pairwise_mode"], cfg["frozen_layers"]
    batch = args.batch_size if mode == "in_batch" else max(1, args.batch_size // 2)  # per_pair: pairs per step
    dm = RankingDataModule(
        data,
        tokenizer,
        "pairwise",
        max_length=args.max_length,
        batch_size=batch,
        eval_batch_size=args.eval_batch_size,
        pairwise_mode=mode,
        max_train_prompts=args.max_train_prompts,
        seed=args.seed,
        head_fraction=args.head_fraction,
        length_buckets=cfg["length_buckets"],
        micro_batches=cfg.get("micro_batches", 1),
        pad_to_multiple_of=cfg.get("pad_to_multiple_of", 1),
    )
    model = LengthRanker.from_pretrained_encoder(args.encoder)
    model.last_layer_all_positions = bool(cfg.get("last_layer_all_positions", False))
    prepare_for_training(model, "pairwise", [])
    cache_s = 0.0
    if frozen:  # as pipeline/train.py train_one: freeze, then run the frozen part once over all prompts
        model.freeze_lower(frozen)
        cache_s = dm.cache_hidden(model, frozen, batch_size=args.eval_batch_size, precision=cfg["precision"])
    model.train()  # from_pretrained returns eval mode; Lightning keeps the mode it finds
    module = RankerModule(model, "pairwise", lr=args.lr, val_pairs=dm.val_pair_idx, frozen_layers=frozen)
    if cfg.get("adamw_loop"):
        module._fused_adamw = lambda params: False
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=1,
        precision=cfg["precision"],
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_model_summary=False,
        enable_progress_bar=not args.quiet,
    )
    with nullcontext() if cfg.get("torch_dropout") else fast_dropout(model):
        trainer.fit(module, datamodule=dm)
    val_trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=cfg["precision"],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    val_trainer.validate(module, datamodule=dm, verbose=False)

    secs, prompts = module.train_seconds, module.prompts_encoded
    prompts_per_s = prompts / secs if secs else 0.0
    # encodings of one epoch: per_pair encodes both prompts of every train pair, in-batch each prompt once
    epoch_prompts = 2 * len(dm.train_pair_idx) if dm.per_pair else len(dm.train_table)
    epoch_s = cache_s + epoch_prompts / prompts_per_s if prompts_per_s else float("inf")
    return {
        "config": name,
        **cfg,
        "batch": batch,
        "steps": int(trainer.global_step),
        "prompts_encoded": prompts,
        "pairs": module.pairs_seen,
        "train_s": round(secs, 1),
        "prompts_per_s": round(prompts_per_s, 2),
        "pairs_per_s": round(module.pairs_seen / secs, 2) if secs else 0.0,
        "cache_s": round(cache_s, 1),
        "epoch_s_est": round(epoch_s, 1),
        "epoch_prompts": epoch_prompts,
        "val_tau_b": round(module.last_val["val_tau_b"], 4),
        "val_pair_acc": round(module.last_val["val_pair_acc"], 4),
        **dm.describe(),
    }


def pooled(runs: list[dict]) -> dict:
    """One configuration's repeats as one row: the counts (`steps`, `prompts_encoded`, `pairs`,
    `train_s`) summed over the runs, so the rates are the summed work over the summed train seconds;
    the median cache pass; each run's steps and prompts/s kept (`steps_runs`, `prompts_per_s_runs`);
    the rest (settings, val metrics) from the first run (the same seed trains the same way each time)."""
    import statistics

    row = dict(runs[0])
    if len(runs) > 1:
        secs = sum(r["train_s"] for r in runs)
        for key in ("steps", "prompts_encoded", "pairs"):
            row[key] = sum(r[key] for r in runs)
        row["train_s"] = round(secs, 1)
        row["prompts_per_s"] = round(row["prompts_encoded"] / secs, 2) if secs else 0.0
        row["pairs_per_s"] = round(row["pairs"] / secs, 2) if secs else 0.0
        row["cache_s"] = round(statistics.median(r["cache_s"] for r in runs), 1)
        row["epoch_s_est"] = (
            round(row["cache_s"] + row["epoch_prompts"] / row["prompts_per_s"], 1)
            if row["prompts_per_s"]
            else float("inf")
        )
    row["runs"] = len(runs)
    row["steps_runs"] = [r["steps"] for r in runs]
    row["prompts_per_s_runs"] = [r["prompts_per_s"] for r in runs]
    return row


def warm_up(args, tokenizer) -> None:
    """One untimed forward/backward, so the first configuration measured does not pay torch's
    first-call costs."""
    from pipeline.ranking.model import LengthRanker

    model = LengthRanker.from_pretrained_encoder(args.encoder)
    enc = tokenizer(
        ["warm up"] * args.batch_size,
        padding="max_length",
        max_length=args.max_length,
        truncation=True,
        return_tensors="pt",
    )
    model(enc["input_ids"], enc["attention_mask"]).sum().backward()


def ratios(rows: list[dict], key: str, base: dict, higher_is_better: bool) -> str:
    """'name 1.8x, ...' of each other row against `base` (>1 = better than base)."""
    out = []
    for r in rows:
        if r is base:
            continue
        a, b = (r[key], base[key]) if higher_is_better else (base[key], r[key])
        out.append(f"{r['config']} {a / b:.2f}x" if b else f"{r['config']} n/a")
    return ", ".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="chatgpt", help="generation model whose pairs to use")
    ap.add_argument("--data", default="data")
    ap.add_argument("--encoder", default="minilm-l6")
    ap.add_argument(
        "--configs",
        default=None,
        help="comma list of configurations to run (default all: full, full+buckets, frozen<k>+buckets, "
        "frozen<k>+buckets+bf16 and its +all_positions, +torch_dropout and +adamw_loop variants, "
        "frozen<k>+shuffle, frozen<k>+micro<m>, each of those two +bf16, frozen<k>+micro<m>[+bf16]+pad<p>, per_pair)",
    )
    ap.add_argument("--steps", type=int, default=60, help="optimiser steps per configuration")
    ap.add_argument("--batch-size", type=int, default=32, help="prompts encoded per step, every configuration")
    ap.add_argument("--eval-batch-size", type=int, default=64, help="validation and cache-pass batch size")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--head-fraction", type=float, default=0.5)
    ap.add_argument("--frozen-layers", type=int, default=3, help="k of the frozen<k>+buckets configuration")
    ap.add_argument("--length-buckets", type=int, default=50, help="length_buckets of the +buckets configurations")
    ap.add_argument(
        "--micro-batches",
        type=lambda text: [int(m) for m in text.split(",")],
        default=[4],
        help="micro_batches of the +micro configurations, a comma list (e.g. 4,8: frozen3+micro4, frozen3+micro8)",
    )
    ap.add_argument(
        "--pad-to-multiple-of",
        type=int,
        default=16,
        help="p of the +pad<p> configurations (widths rounded up to a multiple of p, at most --max-length)",
    )
    ap.add_argument(
        "--max-train-prompts",
        type=int,
        default=3000,
        help="seeded subset of train prompts (bounds the cache pass); 0 = all",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the configurations this many times, alternating their order; rates pool the repeats",
    )
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--quiet", action="store_true", help="no Lightning progress bars")
    args = ap.parse_args(argv)

    available = configurations(args)
    names = list(available) if not args.configs else [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [n for n in names if n not in available]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; choose from {list(available)}")
    if args.repeats < 1 or len(set(names)) != len(names):
        ap.error("--repeats must be >= 1 and --configs must name each configuration once")
    if min(args.micro_batches) < 2:
        ap.error("--micro-batches must be >= 2 (1 is the +shuffle configuration)")

    import torch

    from pipeline.ranking.data import RankingData
    from pipeline.ranking.model import load_tokenizer

    torch.set_num_threads(args.threads)
    data = RankingData.load(args.model, args.data)
    tokenizer = load_tokenizer(args.encoder)
    warm_up(args, tokenizer)
    t0 = time.perf_counter()
    runs: dict[str, list[dict]] = {name: [] for name in names}
    # repeats alternate the order (A B, then B A, ...): this machine's speed drifts by 10-20% within
    # minutes, which a single pass in one order reads as a difference between configurations
    schedule = [name for r in range(args.repeats) for name in (names if r % 2 == 0 else names[::-1])]
    for i, name in enumerate(schedule, 1):
        print(f"[{i}/{len(schedule)}] {name}: start {available[name]}", flush=True)
        t = time.perf_counter()
        row = run_config(name, available[name], args, data, tokenizer)
        runs[name].append(row)
        print(
            f"[{i}/{len(schedule)}] {name}: done in {time.perf_counter() - t:.0f} s, {row['prompts_per_s']} prompts/s, "
            f"cache {row['cache_s']} s, val tau_b {row['val_tau_b']}",
            flush=True,
        )
    rows = [pooled(runs[name]) for name in names]

    first = rows[0]
    print(
        f"\npairwise training on {args.model} pairs, encoder {args.encoder}, max_length {args.max_length}, "
        f"head_fraction {args.head_fraction}, {args.batch_size} prompts encoded per step, {args.steps} steps a run, "
        f"{args.repeats} run(s) per configuration (steps, prompts_encoded, pairs and train_s summed over them), "
        f"lr {args.lr}, {torch.get_num_threads()} threads (train: {first['n_train_prompts']} prompts; "
        f"val: {first['n_val_prompts']} prompts, {first['n_val_pairs']} pairs)"
    )
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in COLUMNS) + " |")
    if len(rows) > 1:
        base = next((r for r in rows if r["config"] == "full"), first)
        print(
            f"speed-up vs {base['config']}: prompts/s {ratios(rows, 'prompts_per_s', base, True)}; "
            f"epoch time (epoch_s_est) {ratios(rows, 'epoch_s_est', base, False)}"
        )
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "results": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    sys.exit(run_script(main))
