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
- `pairwise_head` (with `--head-epochs` > 0): instead of the ridge, a small MLP on the same
  standardised features trained with the pipeline's pairwise loss (`pipeline.ranking.losses`,
  train's graded margin, in-batch pairs kept by δ = 0.2): PARS's objective on a frozen reader. Its
  val τ_b after each epoch (for reading only) and the last epoch's `combined`, cross-fitted as above,
- `prompts_per_s`: the decoder's embedding rate on these cores (the cost a pipeline stage pays).

    python benchmarks/decoder_features.py --json metrics/choices/decoder_features-chatgpt.json
    python benchmarks/decoder_features.py --max-length 64 --layers 15,20 --n-train 3000
    python benchmarks/decoder_features.py --checkpoint models/chatgpt/pairwise --later-turns

The features and ridge are the blend stage's (`pipeline.ranking.decoder`, `blend.features: decoder`).
Needs `dvc repro materialize pairs@chatgpt` (models/base/smollm2, data/pairs/chatgpt). Heavy:
about 16 prompts/s at 128 tokens on 2 cores with AVX512-BF16, about 47 with AMX (bfloat16 both);
run it on idle cores.
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
from pipeline.ranking.decoder import DecoderFeatures, DecoderRidge  # noqa: E402
from pipeline.ranking.metrics import kendall_tau_b  # noqa: E402


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


def pairwise_head(
    x_train, len_train, x_val, len_val, *, epochs: int, hidden: int, seed: int
) -> tuple[np.ndarray, list]:
    """An MLP on standardised features trained with train's pairwise loss (graded margin 0 + 1 per
    log length, in-batch pairs with δ = 0.2, batches of 64): (val scores after the last epoch,
    val τ_b after each epoch)."""
    import torch

    from pipeline.ranking.labels import in_batch_pairs
    from pipeline.ranking.losses import pairwise_loss

    torch.manual_seed(seed)
    mean, sd = x_train.mean(0), x_train.std(0) + 1e-6
    xt = torch.tensor((x_train - mean) / sd, dtype=torch.float32)
    xv = torch.tensor((x_val - mean) / sd, dtype=torch.float32)
    yt = np.asarray(len_train, float)
    net = torch.nn.Sequential(
        torch.nn.Dropout(0.2),
        torch.nn.Linear(xt.shape[1], hidden),
        torch.nn.GELU(),
        torch.nn.Dropout(0.5),
        torch.nn.Linear(hidden, 1),
    )
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4, weight_decay=0.01)
    taus, no_cut = [], np.zeros(len(yt), bool)
    for _ in range(epochs):
        net.train()
        for rows in torch.randperm(len(xt)).split(64):
            pairs = torch.from_numpy(in_batch_pairs(yt[rows], no_cut[rows], 0.2))
            loss = pairwise_loss(
                net(xt[rows]).squeeze(1), torch.tensor(yt[rows]), pairs, margin=0.0, margin_per_log_length=1.0
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            scores = net(xv).squeeze(1).numpy().astype(float)
        taus.append(round(float(kendall_tau_b(scores, len_val)), 4))
    return scores, taus


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data")
    ap.add_argument("--decoder", default="models/base/smollm2", help="a Hugging Face causal LM directory")
    ap.add_argument("--checkpoint", default="models/export/pars-recorded", help="pars checkpoint to combine with")
    ap.add_argument("--n-train", type=int, default=None, help="seeded subset of train first turns (default: all)")
    ap.add_argument(
        "--later-turns", action="store_true", help="also fit on the later human turns of train conversations"
    )
    ap.add_argument("--head-epochs", type=int, default=2, help="epochs of the pairwise MLP head (0: none)")
    ap.add_argument("--head-hidden", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--layers", default="15,20,25", help="comma-separated decoder layers read")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--alphas", default="1000,3000,10000,30000")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    try:
        layers = sorted({int(k) for k in args.layers.split(",")})
        alphas = [float(a) for a in args.alphas.split(",")]
    except ValueError:
        print(
            f"decoder_features: --layers {args.layers!r} / --alphas {args.alphas!r}: expected numbers", file=sys.stderr
        )
        return 2
    if min(layers) < 1 or args.max_length < 8 or args.batch_size < 1 or args.head_epochs < 0 or args.head_hidden < 1:
        print(
            "decoder_features: --layers >= 1, --max-length >= 8, --batch-size >= 1, --head-epochs >= 0, "
            "--head-hidden >= 1",
            file=sys.stderr,
        )
        return 2
    for path in (prompts_path(args.data), labels_path("chatgpt", args.data), Path(args.decoder) / "config.json"):
        if not Path(path).exists():
            print(f"decoder_features: {path} is missing (dvc repro materialize pairs@chatgpt)", file=sys.stderr)
            return 2

    import torch

    torch.set_num_threads(2)
    prompts = pd.read_parquet(prompts_path(args.data))
    labels = pd.read_parquet(labels_path("chatgpt", args.data))
    fitted_on = ["sharegpt", "sharegpt_turns"] if args.later_turns else ["sharegpt"]
    rows = prompts[prompts["dataset"].isin(fitted_on)][["prompt_id", "prompt", "dataset"]].merge(
        labels[["prompt_id", "split", "length"]], on="prompt_id"
    )
    train = rows[rows["split"] == "train"]
    if args.n_train is not None and args.n_train < len(train):
        train = train.sample(n=args.n_train, random_state=0)
    val = rows[(rows["split"] == "val") & (rows["dataset"] == "sharegpt")]
    texts = train["prompt"].tolist() + val["prompt"].tolist()
    print(
        f"decoder_features: {len(train)} train ({' + '.join(fitted_on)}) + {len(val)} val first turns", file=sys.stderr
    )

    # the blend stage's own features and ridge (blend.features: decoder): bfloat16 where native
    features = DecoderFeatures.load(args.decoder, layers, args.max_length)
    t0 = time.perf_counter()
    feats = features.embed(texts, args.batch_size, progress=True)
    embed_s = time.perf_counter() - t0
    y_val = val["length"].to_numpy(float)
    fits = DecoderRidge.fit_grid(feats[: len(train)], train["length"].to_numpy(float), alphas)
    ridge = {a: fit.predict(feats[len(train) :]) for a, fit in zip(alphas, fits)}
    ridge_taus = {a: kendall_tau_b(p, y_val) for a, p in ridge.items()}

    from pipeline.serving.scorer import Scorer

    ckpt = np.asarray(Scorer.from_pretrained(args.checkpoint).score(val["prompt"].tolist()), dtype=float)
    result = {
        "what": "SmolLM2-135M-Instruct hidden states + ridge as ChatGPT answer-length features, val split only",
        "how": "python benchmarks/decoder_features.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "decoder": args.decoder,
        "max_length": args.max_length,
        "layers": layers,
        "dtype": str(features.model.dtype).removeprefix("torch."),
        "train_prompts": len(train),
        "train_datasets": fitted_on,
        "val_prompts": len(val),
        "prompts_per_s": round(len(texts) / embed_s, 2),
        "embed_s": round(embed_s, 1),
        "decoder_ridge": {
            "val_tau_b_by_alpha": {str(a): round(float(t), 4) for a, t in ridge_taus.items()},
            "val_tau_b_best": round(float(max(ridge_taus.values())), 4),
        },
        "checkpoint": {"path": args.checkpoint, "val_tau_b": round(float(kendall_tau_b(ckpt, y_val)), 4)},
        "combined": cross_fit_combination(ckpt, ridge, y_val, [round(0.1 * i, 1) for i in range(11)]),
    }
    if args.head_epochs:
        head, taus = pairwise_head(
            feats[: len(train)],
            train["length"].to_numpy(float),
            feats[len(train) :],
            y_val,
            epochs=args.head_epochs,
            hidden=args.head_hidden,
            seed=0,
        )
        result["pairwise_head"] = {
            "hidden": args.head_hidden,
            "epochs": args.head_epochs,
            "val_tau_b_by_epoch": taus,
            "combined": cross_fit_combination(ckpt, {"head": head}, y_val, [round(0.1 * i, 1) for i in range(11)]),
        }
    print(
        f"| decoder ridge (best alpha) | {result['decoder_ridge']['val_tau_b_best']} |\n"
        f"| checkpoint | {result['checkpoint']['val_tau_b']} |\n"
        f"| combined (cross-fit on val halves) | {result['combined']['val_tau_b']} |\n"
        + (
            f"| pairwise MLP head, last epoch / combined | {result['pairwise_head']['val_tau_b_by_epoch'][-1]} / "
            f"{result['pairwise_head']['combined']['val_tau_b']} |\n"
            if args.head_epochs
            else ""
        )
        + f"| embedding | {result['prompts_per_s']} prompts/s ({len(texts)} prompts, {embed_s:.0f} s) |"
    )
    if args.json:
        write_json(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
