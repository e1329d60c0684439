"""Frozen decoder hidden states as answer-length features: is the packaged SmolLM2-135M-Instruct a
better source of length signal than the fine-tuned MiniLM, and does it add to it? Val only.

Fu et al., "Efficient LLM Scheduling by Learning to Rank" (arXiv 2408.15792) rank with a small
decoder (OPT-125M). This measures the cheapest form of that here: the packaged SmolLM2 reads each
ShareGPT first turn (head + tail cut to `--max-length` tokens, inside its chat template with the
generation prompt, so the last position is "about to answer"), and the last-position and mean
hidden states of `--layers` feed a standardised ridge regression of log(1 + ChatGPT's answer
tokens), fitted on the train split. Reported on the val split:

- `decoder_ridge`: the ridge alone (alpha chosen on val: an upper estimate),
- `checkpoint`: the given checkpoint's own scores (default: the serving export),
- `combined`: w * z(checkpoint) + (1 - w) * z(ridge), alpha and w chosen on one half of val and
  scored on the other half, both ways (2-fold cross-fit: no figure is scored where it was chosen),
- `mlp_heads` (with `--head-epochs` > 0): instead of the ridge, the blend stage's MLP head
  (`DecoderMLPHead`: `--head-seeds` MLPs on the same standardised features, averaged), once per loss
  of `--head-losses`: pairwise (PARS's objective on a frozen reader: train's graded margin, in-batch
  pairs kept by δ = 0.2; the blend's), pointwise or listwise (the pipeline's other losses, same
  settings). Each head's val τ_b and its `combined`, cross-fitted as above,
- `prompts_per_s`: the decoder's embedding rate on these cores (the cost a pipeline stage pays).

    python benchmarks/decoder_features.py --json metrics/choices/decoder_features-chatgpt.json
    python benchmarks/decoder_features.py --max-length 64 --layers 15,20 --n-train 3000
    python benchmarks/decoder_features.py --checkpoint models/chatgpt/pairwise --later-turns
    python benchmarks/decoder_features.py --decoder models/base/qwen2.5-coder-0.5b --layers 8,12,16 \
        --checkpoint models/chatgpt/pairwise --features-cache /tmp/qwen.npz   # the default blend's reader

`--features-cache` keeps the features between runs: a run reading fewer layers, or fewer train
prompts, of the same decoder (the same files: a sha256 of its directory) takes them from the file
instead of the decoder.

The features and ridge are the blend stage's (`pipeline.ranking.decoder`, `blend.features: decoder`).
Needs `dvc repro materialize pairs@chatgpt` (models/base/smollm2, data/pairs/chatgpt). Heavy:
Qwen2.5-0.5B at 128 tokens, about 22 prompts/s on 2 Zen 5 cores with AVX512-BF16 (bfloat16, the
template's prefix cached: benchmarks/reader_prefix_cache.py); run it on idle cores.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.cli import comma_names, comma_numbers  # noqa: E402
from pipeline.contracts import labels_path, prompts_path, write_json  # noqa: E402
from pipeline.ranking.decoder import DecoderFeatures, DecoderMLPHead, DecoderRidge  # noqa: E402
from pipeline.ranking.losses import LOSSES  # noqa: E402
from pipeline.ranking.metrics import kendall_tau_b  # noqa: E402


def add_reader_flags(
    ap: argparse.ArgumentParser,
    layers: str,
    decoder: str = "models/base/qwen2.5-coder-0.5b",
    cache_required: bool = False,
) -> None:
    """The flags of the benchmarks that read ChatGPT's prompts with a decoder (the blend's by default),
    or take its features from this benchmark's cache: data root, decoder, layers, prompt tokens."""
    ap.add_argument("--data", default="data")
    ap.add_argument("--decoder", default=decoder, help="a Hugging Face causal LM directory")
    ap.add_argument("--layers", type=comma_numbers(int, minimum=1), default=layers, help="comma-separated layers read")
    ap.add_argument("--max-length", type=int, default=128, help="prompt tokens read, head + tail")
    ap.add_argument(
        "--features-cache",
        required=cache_required,
        help="an .npz of computed features, read when it matches, else written",
    )


def reader_inputs_missing(args: argparse.Namespace, script: str) -> bool:
    """True, after one line on stderr naming the path, when the data root's ChatGPT prompts and labels
    or the decoder (`add_reader_flags`' --data and --decoder) are missing."""
    for path in (prompts_path(args.data), labels_path("chatgpt", args.data), Path(args.decoder) / "config.json"):
        if not Path(path).exists():
            print(f"{script}: {path} is missing (dvc repro materialize pairs@chatgpt)", file=sys.stderr)
            return True
    return False


def zscore(x: np.ndarray) -> np.ndarray:
    return (x - x.mean()) / (x.std() or 1.0)


def cross_fit_combination(ckpt, ridge_by_alpha, y, weights, seed: int = 0) -> dict:
    """Choose (alpha, w) on one random half of val, score on the other; both ways."""
    half = np.random.default_rng(seed).random(y.size) < 0.5
    taus, picks = [], []
    for choose in (half, ~half):
        score = ~choose
        best = max(
            ((a, w) for a in ridge_by_alpha for w in weights),
            key=lambda aw: kendall_tau_b(
                aw[1] * zscore(ckpt[choose]) + (1 - aw[1]) * zscore(ridge_by_alpha[aw[0]][choose]), y[choose]
            ),
        )
        a, w = best
        taus.append(kendall_tau_b(w * zscore(ckpt[score]) + (1 - w) * zscore(ridge_by_alpha[a][score]), y[score]))
        picks.append({"alpha": a, "checkpoint_weight": w})
    return {"val_tau_b": round(float(np.mean(taus)), 4), "halves": [round(float(t), 4) for t in taus], "chosen": picks}


def head_settings() -> dict:
    """params.yaml's blend.decoder.pairwise_head as DecoderMLPHead.fit's settings (their one home);
    one line and exit 2 when it cannot be read."""
    from pipeline.blend import pairwise_head_settings
    from pipeline.errors import PARSError
    from pipeline.params import load_params

    try:
        return pairwise_head_settings(load_params("blend")["decoder"]["pairwise_head"], "blend.decoder.pairwise_head")
    except (OSError, KeyError, ValueError, PARSError) as exc:
        print(f"{Path(sys.argv[0]).name}: params blend.decoder.pairwise_head: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def decoder_fingerprint(decoder) -> str:
    """The sha256 of a decoder directory's files (config, tokenizer, weights): a features cache is
    read back only for the same weights, not merely the same path (`pars materialize` rewrites
    models/base/). A hub id or a missing path is its own fingerprint."""
    root = Path(decoder)
    if not root.is_dir():
        return str(decoder)
    digest = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f"{f.relative_to(root).as_posix()}\0{f.stat().st_size}\0".encode())
        with f.open("rb") as fh:
            while block := fh.read(1 << 24):
                digest.update(block)
    return digest.hexdigest()


def features_of(decoder, layers, max_length, batch_size, ids, texts, cache) -> tuple[np.ndarray, float, str]:
    """(features of `texts` in order, prompts embedded per second, dtype, where from). With `cache` (an
    .npz path), features of the same decoder (its files' fingerprint) and max_length are read from it
    when it holds every prompt id and read layer (the columns of the layers not asked for dropped; the
    rate is then the cache's, for the layers it holds), else computed and written there."""
    fingerprint = decoder_fingerprint(decoder) if cache else None
    if cache and Path(cache).exists():
        with np.load(cache, allow_pickle=False) as c:
            held = [int(k) for k in c["layers"]]
            if (
                "decoder_fingerprint" in c.files
                and str(c["decoder_fingerprint"]) == fingerprint
                and int(c["max_length"]) == max_length
                and set(layers) <= set(held)
                and set(ids) <= set(c["prompt_ids"].tolist())
            ):
                row = {pid: i for i, pid in enumerate(c["prompt_ids"].tolist())}
                width = c["features"].shape[1] // len(held)  # per layer: last position + mean
                cols = np.concatenate([np.arange(held.index(k) * width, (held.index(k) + 1) * width) for k in layers])
                print(f"decoder_features: features from {cache}", file=sys.stderr)
                rate = len(row) / float(c["embed_s"])
                return c["features"][[row[i] for i in ids]][:, cols], rate, str(c["dtype"]), f"{cache} (layers {held})"
    # the blend stage's own features: bfloat16 where native
    features = DecoderFeatures.load(decoder, layers, max_length)
    t0 = time.perf_counter()
    feats = features.embed(texts, batch_size, progress=True)
    embed_s = time.perf_counter() - t0
    dtype = str(features.model.dtype).removeprefix("torch.")
    if cache:
        np.savez(
            cache,
            features=feats,
            layers=np.array(layers),
            prompt_ids=np.array(ids),
            decoder=str(decoder),
            decoder_fingerprint=fingerprint,
            max_length=max_length,
            embed_s=embed_s,
            dtype=dtype,
        )
    return feats, len(texts) / embed_s, dtype, "the decoder"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_reader_flags(ap, layers="15,20,25", decoder="models/base/smollm2")
    ap.add_argument("--checkpoint", default="models/export/pars-recorded", help="pars checkpoint to combine with")
    ap.add_argument("--n-train", type=int, default=None, help="seeded subset of train first turns (default: all)")
    ap.add_argument(
        "--later-turns", action="store_true", help="also fit on the later human turns of train conversations"
    )
    # the head's other settings are the blend's (params.yaml blend.decoder.pairwise_head)
    ap.add_argument(
        "--head-epochs", type=int, default=None, help="epochs of each MLP head (0: none; default: the blend's)"
    )
    ap.add_argument("--head-hidden", type=int, default=None, help="its hidden units (default: the blend's)")
    ap.add_argument(
        "--head-seeds", type=int, default=None, help="MLPs averaged in each MLP head (default: the blend's)"
    )
    ap.add_argument(
        "--head-losses",
        type=comma_names(tuple(LOSSES)),
        default="pairwise",
        help="comma-separated losses to train an MLP head with, each on the same features (pairwise, pointwise, listwise)",
    )
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--alphas", type=comma_numbers(float), default="1000,3000,10000,30000")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    layers, alphas, head_losses = sorted(set(args.layers)), args.alphas, args.head_losses
    head_cfg = head_settings()
    for key in ("epochs", "hidden", "seeds"):
        if getattr(args, f"head_{key}") is not None:
            head_cfg[key] = getattr(args, f"head_{key}")
    if (
        args.max_length < 8
        or args.batch_size < 1
        or head_cfg["epochs"] < 0
        or head_cfg["hidden"] < 1
        or head_cfg["seeds"] < 1
    ):
        print(
            "decoder_features: --max-length >= 8, --batch-size >= 1, --head-epochs >= 0, "
            "--head-hidden >= 1, --head-seeds >= 1",
            file=sys.stderr,
        )
        return 2
    if reader_inputs_missing(args, "decoder_features"):
        return 2

    import torch

    torch.set_num_threads(2)
    prompts = pd.read_parquet(prompts_path(args.data))
    labels = pd.read_parquet(labels_path("chatgpt", args.data))
    fitted_on = ["sharegpt", "sharegpt_turns"] if args.later_turns else ["sharegpt"]
    rows = prompts[prompts["dataset"].isin(fitted_on)][["prompt_id", "prompt", "dataset"]].merge(
        labels[["prompt_id", "split", "length", "truncated"]], on="prompt_id"
    )
    train = rows[rows["split"] == "train"]
    if args.n_train is not None and args.n_train < len(train):
        train = train.sample(n=args.n_train, random_state=0)
    val = rows[(rows["split"] == "val") & (rows["dataset"] == "sharegpt")]
    texts = train["prompt"].tolist() + val["prompt"].tolist()
    print(
        f"decoder_features: {len(train)} train ({' + '.join(fitted_on)}) + {len(val)} val first turns", file=sys.stderr
    )

    ids = train["prompt_id"].tolist() + val["prompt_id"].tolist()
    feats, prompts_per_s, dtype, features_from = features_of(
        args.decoder, layers, args.max_length, args.batch_size, ids, texts, args.features_cache
    )
    y_val = val["length"].to_numpy(float)
    fits = DecoderRidge.fit_grid(feats[: len(train)], train["length"].to_numpy(float), alphas)
    ridge = {a: fit.predict(feats[len(train) :]) for a, fit in zip(alphas, fits)}
    ridge_taus = {a: kendall_tau_b(p, y_val) for a, p in ridge.items()}

    from pipeline.serving.scorer import Scorer

    ckpt = np.asarray(Scorer.from_pretrained(args.checkpoint).score(val["prompt"].tolist()), dtype=float)
    result = {
        "what": f"{Path(args.decoder).name} hidden states + ridge or MLP heads as ChatGPT answer-length features, val split only",
        "how": "python benchmarks/decoder_features.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "decoder": args.decoder,
        "max_length": args.max_length,
        "layers": layers,
        "dtype": dtype,
        "train_prompts": len(train),
        "train_datasets": fitted_on,
        "val_prompts": len(val),
        "prompts_per_s": round(prompts_per_s, 2),
        "features_from": features_from,
        "decoder_ridge": {
            "val_tau_b_by_alpha": {str(a): round(float(t), 4) for a, t in ridge_taus.items()},
            "val_tau_b_best": round(float(max(ridge_taus.values())), 4),
        },
        "checkpoint": {"path": args.checkpoint, "val_tau_b": round(float(kendall_tau_b(ckpt, y_val)), 4)},
        "combined": cross_fit_combination(ckpt, ridge, y_val, [round(0.1 * i, 1) for i in range(11)]),
    }
    rows_out = [
        f"| decoder ridge (best alpha) | {result['decoder_ridge']['val_tau_b_best']} |",
        f"| checkpoint | {result['checkpoint']['val_tau_b']} |",
        f"| combined (cross-fit on val halves) | {result['combined']['val_tau_b']} |",
    ]
    if head_cfg["epochs"]:
        result["mlp_heads"] = dict(head_cfg)
        for loss in head_losses:
            head = DecoderMLPHead.fit(
                feats[: len(train)],
                train["length"].to_numpy(float),
                train["truncated"].to_numpy(bool),
                loss=loss,
                **head_cfg,
            ).predict(feats[len(train) :])
            result["mlp_heads"][loss] = {
                "val_tau_b": round(float(kendall_tau_b(head, y_val)), 4),
                "combined": cross_fit_combination(ckpt, {"head": head}, y_val, [round(0.1 * i, 1) for i in range(11)]),
            }
            rows_out.append(
                f"| {loss} MLP head ({head_cfg['seeds']} seeds) / combined | {result['mlp_heads'][loss]['val_tau_b']} / "
                f"{result['mlp_heads'][loss]['combined']['val_tau_b']} |"
            )
    rows_out.append(f"| embedding | {result['prompts_per_s']} prompts/s (features from {features_from}) |")
    print("\n".join(rows_out))
    if args.json:
        write_json(result, args.json)
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
