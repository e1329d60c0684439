"""Scoring throughput of an exported checkpoint on this CPU: prompts/s and per-batch latency.

For each batch size (default 1, 2, 4, 8, 16, 32, 64) it scores random batches of real test prompts
(data/prompts, test split) through `Scorer.score` (tokenization, dynamic padding, truncation to
max_length, inference mode: the serving path) for at least `--seconds` and `--min-batches`, after
one warm-up batch, and prints prompts/s and p50/p99 latency per batch.

    python benchmarks/score_throughput.py                        # the default export
    python benchmarks/score_throughput.py --checkpoint DIR --out metrics/score_throughput.json
    python benchmarks/score_throughput.py --untrained-minilm     # before any export exists

`--untrained-minilm` times the same architecture (packaged MiniLM-L6 + linear head, max length
128) with a random head: throughput does not depend on the weights' values. The machine's load
average is printed beside the figures: on a shared CPU they move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.cli import comma_numbers  # noqa: E402

DEFAULT_CHECKPOINT = "models/export/pars-recorded"


def untrained_minilm(out: Path, max_length: int = 128) -> Path:
    import torch

    from pipeline.ranking.checkpoint import save_checkpoint
    from pipeline.ranking.model import LengthRanker, load_tokenizer

    torch.manual_seed(0)
    model = LengthRanker.from_pretrained_encoder("minilm-l6")
    return save_checkpoint(
        model, load_tokenizer("minilm-l6"), out, method="untrained", max_length=max_length, encoder="minilm-l6"
    )


def bench(scorer, prompts: list[str], batch_size: int, seconds: float, min_batches: int, rng) -> dict:
    scorer.score(list(rng.choice(prompts, batch_size)), batch_size=batch_size)  # warm-up
    latencies, n = [], 0
    start = time.perf_counter()
    while len(latencies) < min_batches or time.perf_counter() - start < seconds:
        batch = list(rng.choice(prompts, batch_size))
        t0 = time.perf_counter()
        scorer.score(batch, batch_size=batch_size)
        latencies.append(time.perf_counter() - t0)
        n += batch_size
    lat = np.array(latencies)
    return {
        "batch_size": batch_size,
        "batches": len(lat),
        "prompts_per_s": n / lat.sum(),
        "p50_ms": 1000 * float(np.percentile(lat, 50)),
        "p99_ms": 1000 * float(np.percentile(lat, 99)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT)
    ap.add_argument("--untrained-minilm", action="store_true", help="time a random-head MiniLM checkpoint instead")
    ap.add_argument("--prompts", default="data/prompts/prompts.parquet")
    ap.add_argument("--batch-sizes", type=comma_numbers(int, minimum=1), default="1,2,4,8,16,32,64")
    ap.add_argument("--seconds", type=float, default=5.0, help="minimum timed seconds per batch size")
    ap.add_argument("--min-batches", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's, = cores)")
    ap.add_argument("--out", help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    if not Path(args.prompts).is_file():
        raise FileNotFoundError(f"--prompts {args.prompts}: no such file (dvc repro prepare)")

    import pandas as pd
    import torch

    from pipeline.serving.scorer import Scorer

    if args.threads:
        torch.set_num_threads(args.threads)
    prompts_df = pd.read_parquet(args.prompts, columns=["prompt", "split"])
    prompts = prompts_df.loc[prompts_df["split"] == "test", "prompt"].tolist()
    if not prompts:
        print(f"{args.prompts} has no test prompts", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        if args.untrained_minilm:
            path = untrained_minilm(Path(tmp) / "minilm")
        else:
            path = Path(args.checkpoint)
            if not path.is_dir():
                print(
                    f"{path} does not exist: run `dvc repro export` (or pass --checkpoint, or " f"--untrained-minilm)",
                    file=sys.stderr,
                )
                return 1
        scorer = Scorer.from_pretrained(path)
        ids = scorer.tokenizer(prompts, truncation=True, max_length=scorer.max_length)["input_ids"]
        mean_tokens = float(np.mean([len(x) for x in ids]))
        rng = np.random.default_rng(args.seed)
        print(
            f"checkpoint: {'untrained MiniLM-L6 (packaged)' if args.untrained_minilm else path}; "
            f"encoder {scorer.meta.get('encoder')}, max_length {scorer.max_length}; {len(prompts)} test prompts, "
            f"{mean_tokens:.0f} tokens on average after truncation; torch threads {torch.get_num_threads()}, "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        print(f"{'batch':>5} {'batches':>7} {'prompts/s':>10} {'p50 ms':>9} {'p99 ms':>9}")
        rows = []
        for bs in args.batch_sizes:
            r = bench(scorer, prompts, bs, args.seconds, args.min_batches, rng)
            rows.append(r)
            print(
                f"{bs:>5} {r['batches']:>7} {r['prompts_per_s']:>10.1f} {r['p50_ms']:>9.1f} {r['p99_ms']:>9.1f}",
                flush=True,
            )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {
                    "checkpoint": "untrained-minilm" if args.untrained_minilm else str(args.checkpoint),
                    "max_length": scorer.max_length,
                    "mean_tokens": mean_tokens,
                    "torch_threads": torch.get_num_threads(),
                    "load_average": os.getloadavg()[0],
                    "results": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    sys.exit(run_script(main))
