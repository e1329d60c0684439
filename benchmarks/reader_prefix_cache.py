"""Prefix caching in the Qwen reader, side by side: the blend's decoder features of the same ChatGPT val
prompts read whole and with the chat template's shared prefix (system turn and user header) run once
and its keys and values reused (`DecoderFeatures.embed(prefix_cache=...)`), in one process,
alternating the order over `--repeats` rounds. Prints each way's prompts/s, their ratio, and how
closely the features agree (bfloat16 rounds a little differently in another batch shape). Val only.

    python benchmarks/reader_prefix_cache.py --n 320 --json metrics/reader_prefix_cache.json

Needs `dvc repro materialize pairs@chatgpt` (models/base/qwen2.5-coder-0.5b, data/pairs/chatgpt);
reads `blend.decoder` (layers, max_length, batch_size) from params.yaml. Heavy: run on idle cores.
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
from pipeline.hardware import machine  # noqa: E402
from pipeline.params import load_params  # noqa: E402
from pipeline.ranking.decoder import DecoderFeatures  # noqa: E402


def agreement(a: np.ndarray, b: np.ndarray) -> dict:
    """Row cosine (min, median) and the largest difference relative to the largest feature."""
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {
        "cosine_min": round(float(cos.min()), 6),
        "cosine_median": round(float(np.median(cos)), 6),
        "max_abs_diff_over_max_abs": float(np.abs(a - b).max() / np.abs(a).max()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data")
    ap.add_argument("--decoder", default=None, help="decoder directory (default: params blend.decoder.path)")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--n", type=int, default=320, help="ChatGPT val prompts read (a seeded draw)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds, each way once per round, order alternating")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    if args.n < 1 or args.repeats < 1:
        print("reader_prefix_cache: --n and --repeats must be >= 1", file=sys.stderr)
        return 2
    cfg = load_params("blend", args.params)["decoder"]
    decoder = args.decoder or cfg["path"]
    if not Path(decoder).is_dir():
        print(f"reader_prefix_cache: --decoder {decoder}: no such directory (dvc repro materialize)", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(2)
    labels = pd.read_parquet(labels_path("chatgpt", args.data))
    prompts = pd.read_parquet(prompts_path(args.data)).set_index("prompt_id")["prompt"]
    val = labels[labels["split"] == "val"]["prompt_id"].drop_duplicates()
    texts = prompts.loc[val.sample(n=min(args.n, len(val)), random_state=0)].tolist()
    features = DecoderFeatures.load(decoder, cfg["layers"], cfg["max_length"])
    batch = int(cfg["batch_size"])
    features.embed(texts[:batch], batch)  # warm-up: first calls compile kernels
    rates: dict[str, list[float]] = {"whole": [], "prefix_cache": []}
    feats = {}
    for r in range(args.repeats):
        for way in ("whole", "prefix_cache") if r % 2 == 0 else ("prefix_cache", "whole"):
            t0 = time.perf_counter()
            feats[way] = features.embed(texts, batch, prefix_cache=way == "prefix_cache")
            rates[way].append(len(texts) / (time.perf_counter() - t0))
            print(f"round {r}: {way}: {rates[way][-1]:.1f} prompts/s", flush=True)
    encoded = features.encode(texts)
    out = {
        "question": "How much faster does the blend's Qwen reader run with the chat template's shared prefix cached, and do its features stay the same?",
        "command": "python benchmarks/reader_prefix_cache.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {**machine(), "torch_threads": torch.get_num_threads()},
        "decoder": str(decoder),
        "dtype": str(features.model.dtype).removeprefix("torch."),
        "layers": list(features.layers),
        "max_length": features.max_length,
        "batch_size": batch,
        "prompts": len(texts),
        "mean_tokens": round(float(np.mean([len(e) for e in encoded])), 1),
        "prefix_tokens": len(features.shared_prefix()),
        "prompts_per_s": {way: [round(x, 2) for x in v] for way, v in rates.items()},
        "speedup": round(float(np.mean(rates["prefix_cache"]) / np.mean(rates["whole"])), 3),
        "features": agreement(feats["whole"], feats["prefix_cache"]),
    }
    print(
        f"whole {np.mean(rates['whole']):.1f} prompts/s, prefix cache {np.mean(rates['prefix_cache']):.1f}: "
        f"{out['speedup']:.2f}x ({out['prefix_tokens']} of {out['mean_tokens']} tokens shared); features "
        f"cosine >= {out['features']['cosine_min']}"
    )
    if args.json:
        write_json(out, Path(args.json))
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
