"""Does the blend's reader head gain from more of each prompt than the last position and the mean?
Val only.

The blend stage's Qwen reader (`blend.decoder`) gives its pairwise head, per layer read, two vectors:
the hidden state at the last position and the mean over the prompt. A prompt of ~50 tokens holds more
than that. In the same forward pass this benchmark keeps every prompt token's state at
`--token-layers` (the template's shared prefix aside) and asks whether the head ranks ChatGPT's val
first turns better with

- pooled statistics of those tokens added to its input: the max, the standard deviation, and the means
  of the last 12 and of the first 16 tokens (a chat prompt's instruction often stands at one end);
- an attention pooling beside it: the tokens projected to 128 dimensions and pooled by 4 learned
  attention heads, next to the blend's MLP on the usual features, trained end to end with the same
  pairwise loss, schedule and seeds.

Each variant is reported as val τ_b alone and blended with `--checkpoint`, the blend weight
cross-fitted on val halves (decoder_features.py's `cross_fit_combination`). The heads' settings are
params.yaml's `blend.decoder.pairwise_head`; `the blend's head` is the blend stage's own head on the
same features (a check that this run reproduces it).

    python benchmarks/decoder_pooling.py --features-cache /tmp/tokens.npz \
        --json metrics/choices/decoder_pooling-chatgpt.json

Heavy: one reader pass over ChatGPT's train and val first turns (about 10 min on 2 Zen 5 cores;
`--features-cache` keeps it, about 2.4 GB for two token layers), then about 15 minutes of heads.
Needs `dvc repro materialize pairs@chatgpt`.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decoder_features import (  # noqa: E402
    add_reader_flags,
    cross_fit_combination,
    decoder_fingerprint,
    head_settings,
    reader_inputs_missing,
)

from pipeline.cli import comma_numbers  # noqa: E402
from pipeline.contracts import labels_path, prompts_path, write_json  # noqa: E402
from pipeline.ranking.metrics import kendall_tau_b  # noqa: E402

STATISTICS = ("max", "std", "last-12 mean", "first-16 mean")


def read_token_states(features, token_layers, texts, batch_size: int):
    """(the reader's features of `texts` in order, token offsets, token states): for prompt i, rows
    offsets[i]:offsets[i+1] of the states (a bfloat16 tensor, `token_layers` side by side) are its
    tokens after the cached prefix (a prompt read whole, without the prefix cache, keeps them all).

    Forward hooks on the decoder layers catch the states; each `embed` call gets prompts of similar
    length, few enough for one batch per prefix-cache group, so the batches come back in a known order."""
    import torch

    encoded = features.encode(texts)
    prefix = features.shared_prefix()
    cached = [len(e) > len(prefix) and e[: len(prefix)] == prefix for e in encoded]
    seqs = [e[len(prefix) :] if c else e for e, c in zip(encoded, cached)]
    caught: list[torch.Tensor] = []

    def keep(module, inputs, output):
        caught.append((output[0] if isinstance(output, tuple) else output).detach())

    hooks = [features.model.layers[k - 1].register_forward_hook(keep) for k in token_layers]
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
    feats = np.zeros((len(texts), features.width), np.float32)
    states: list = [None] * len(texts)
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            caught.clear()
            feats[chunk] = features.embed([texts[i] for i in chunk], batch_size=len(chunk))
            groups = [[i for i in chunk if cached[i] == c] for c in (True, False)]
            groups = [g for g in groups if g]
            per_batch = len(token_layers)
            runs = [
                caught[s : s + per_batch] for s in range(len(caught) - per_batch * len(groups), len(caught), per_batch)
            ]
            for rows, outputs in zip(groups, runs):  # the first run of a reader may be the prefix's: skipped
                for j, i in enumerate(rows):  # left padded: a prompt's tokens are the last len(seq)
                    n = len(seqs[i])
                    states[i] = torch.cat([h[j, h.shape[1] - n :] for h in outputs], 1).to(torch.bfloat16)
            if start // batch_size % 100 == 0:
                print(f"decoder_pooling: read {start + len(chunk)}/{len(texts)} prompts", file=sys.stderr, flush=True)
    finally:
        for hook in hooks:
            hook.remove()
    offsets = np.cumsum([0] + [len(s) for s in states])
    return feats, offsets, torch.cat(states)


def pooled_statistics(states, offsets) -> dict[str, np.ndarray]:
    """Per prompt, over its token states: the max, the standard deviation (0 for one token) and the
    means of the last 12 and the first 16 tokens."""
    import torch

    out = {name: [] for name in STATISTICS}
    for i in range(len(offsets) - 1):
        h = states[offsets[i] : offsets[i + 1]].float()
        out["max"].append(h.max(0).values)
        out["std"].append(h.std(0) if len(h) > 1 else torch.zeros(h.shape[1]))
        out["last-12 mean"].append(h[-12:].mean(0))
        out["first-16 mean"].append(h[:16].mean(0))
    return {name: torch.stack(v).numpy() for name, v in out.items()}


def attention_pooling_head(width_tokens: int, width_features: int, hidden: int, k: int = 128, heads: int = 4):
    """score = Linear([MLP(features), attention-pooled projected tokens]); dropout as the blend's MLP."""
    import torch

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.project = torch.nn.Sequential(torch.nn.Dropout(0.2), torch.nn.Linear(width_tokens, k), torch.nn.GELU())
            self.attend = torch.nn.Linear(k, heads)
            self.mlp = torch.nn.Sequential(
                torch.nn.Dropout(0.2), torch.nn.Linear(width_features, hidden), torch.nn.GELU()
            )
            self.out = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(hidden + heads * k, 1))

        def forward(self, tokens, mask, features):
            p = self.project(tokens)  # (batch, tokens, k)
            weights = self.attend(p).masked_fill(~mask[..., None], float("-inf")).softmax(1)
            pooled = torch.einsum("bth,btk->bhk", weights, p).flatten(1)
            return self.out(torch.cat([self.mlp(features), pooled], 1)).squeeze(1)

    return Head()


def fit_attention_heads(states, offsets, feats, y, cut, train, val, cfg: dict) -> np.ndarray:
    """The mean over `cfg['seeds']` attention-pooling heads of their val scores, each trained as the
    blend's MLP is (pairwise loss with its margins and δ, `fit_one_cycle`)."""
    import torch

    from pipeline.ranking.decoder import fit_one_cycle
    from pipeline.ranking.labels import in_batch_pairs
    from pipeline.ranking.losses import pairwise_loss

    sample = states[offsets[train[0]] : offsets[train[-1] + 1] : 7].float()
    mu, sd = sample.mean(0), sample.std(0) + 1e-3
    fm, fs = feats[train].mean(0), feats[train].std(0)
    fs[fs == 0] = 1.0
    z = torch.from_numpy((feats - fm) / fs).float()

    def batch(rows):
        hs = [(states[offsets[i] : offsets[i + 1]].float() - mu) / sd for i in rows]
        tokens = torch.zeros(len(rows), max(len(h) for h in hs), hs[0].shape[1])
        mask = torch.zeros(tokens.shape[:2], dtype=torch.bool)
        for j, h in enumerate(hs):
            tokens[j, : len(h)], mask[j, : len(h)] = h, True
        return tokens, mask, z[rows]

    def batch_loss(net, picked):
        rows = train[picked.numpy()]
        pairs = torch.from_numpy(in_batch_pairs(y[rows], cut[rows], cfg["delta"]))
        return pairwise_loss(
            net(*batch(rows)),
            torch.from_numpy(y[rows]).float(),
            pairs,
            margin=cfg["margin"],
            margin_per_log_length=cfg["margin_per_log_length"],
        )

    scores = []
    for seed in range(cfg["seeds"]):
        torch.manual_seed(seed)
        net = attention_pooling_head(states.shape[1], z.shape[1], cfg["hidden"])
        fit_one_cycle(
            net,
            len(train),
            functools.partial(batch_loss, net),
            epochs=cfg["epochs"],
            lr=cfg["lr"],
            batch_size=cfg["batch_size"],
        )
        net.eval()
        with torch.no_grad():
            scores.append(np.concatenate([net(*batch(val[s : s + 256])).numpy() for s in range(0, len(val), 256)]))
        print(f"decoder_pooling: attention head {seed + 1}/{cfg['seeds']} trained", file=sys.stderr, flush=True)
    return np.mean(scores, 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_reader_flags(ap, layers="8,10,12,14,16")
    ap.add_argument(
        "--token-layers",
        type=comma_numbers(int, minimum=1),
        default="12,16",
        help="comma-separated layers whose token states are kept (each must be among --layers' depth)",
    )
    ap.add_argument(
        "--checkpoint", default="models/chatgpt/pairwise", help="pars checkpoint the heads are blended with"
    )
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    layers, token_layers = sorted(set(args.layers)), sorted(set(args.token_layers))
    if args.max_length < 8 or args.batch_size < 1 or token_layers[-1] > layers[-1]:
        print(
            "decoder_pooling: --max-length >= 8, --batch-size >= 1, --token-layers up to --layers' deepest",
            file=sys.stderr,
        )
        return 2
    if reader_inputs_missing(args, "decoder_pooling"):
        return 2
    cfg = head_settings()

    import torch

    from pipeline.ranking.decoder import DecoderFeatures, DecoderMLPHead

    torch.set_num_threads(2)
    prompts = pd.read_parquet(prompts_path(args.data))
    labels = pd.read_parquet(labels_path("chatgpt", args.data))
    rows = prompts[prompts["dataset"] == "sharegpt"][["prompt_id", "prompt"]].merge(
        labels[["prompt_id", "split", "length", "truncated"]], on="prompt_id"
    )
    rows = pd.concat([rows[rows["split"] == "train"], rows[rows["split"] == "val"]])
    ids, texts = rows["prompt_id"].tolist(), rows["prompt"].tolist()
    train, val = np.where(rows["split"] == "train")[0], np.where(rows["split"] == "val")[0]
    y, cut = rows["length"].to_numpy(float), rows["truncated"].to_numpy(bool)
    print(f"decoder_pooling: {len(train)} train + {len(val)} val ChatGPT first turns", file=sys.stderr)

    settings = {
        "decoder_fingerprint": decoder_fingerprint(args.decoder),
        "max_length": args.max_length,
        "layers": layers,
        "token_layers": token_layers,
    }
    cache = Path(args.features_cache) if args.features_cache else None
    t0 = time.perf_counter()
    hit = False
    if cache and cache.exists():
        with np.load(cache, allow_pickle=False) as c:
            hit = (
                all(np.array_equal(c[k], np.asarray(v)) for k, v in settings.items())
                and c["prompt_ids"].tolist() == ids
            )
            if hit:
                feats, offsets = c["features"], c["offsets"]
                states = torch.from_numpy(c["states"]).view(torch.bfloat16)
                read_s = float(c["read_s"])
                print(f"decoder_pooling: token states from {cache}", file=sys.stderr)
    if not hit:
        reader = DecoderFeatures.load(args.decoder, layers, args.max_length)
        feats, offsets, states = read_token_states(reader, token_layers, texts, args.batch_size)
        read_s = time.perf_counter() - t0
        if cache:
            np.savez(
                cache,
                features=feats,
                offsets=offsets,
                states=states.view(torch.int16).numpy(),
                prompt_ids=np.array(ids),
                read_s=read_s,
                **{k: np.asarray(v) for k, v in settings.items()},
            )

    from pipeline.serving.scorer import Scorer

    ckpt = np.asarray(Scorer.from_pretrained(args.checkpoint).score([texts[i] for i in val]), dtype=float)
    weights = [round(0.1 * i, 1) for i in range(11)]
    variants: dict[str, dict] = {}

    def record(name: str, score: np.ndarray) -> None:
        variants[name] = {
            "val_tau_b": round(float(kendall_tau_b(score, y[val])), 4),
            "blend_val_tau_b": cross_fit_combination(ckpt, {"head": score}, y[val], weights)["val_tau_b"],
        }
        print(f"| {name} | {variants[name]['val_tau_b']} | {variants[name]['blend_val_tau_b']} |", flush=True)

    def mlp_head(x: np.ndarray) -> np.ndarray:
        return DecoderMLPHead.fit(x[train], y[train], cut[train], **cfg).predict(x[val])

    t1 = time.perf_counter()
    print("| head | val τ_b | blended with the checkpoint (cross-fit) |\n|---|---|---|")
    record("the blend's head (last position + mean)", mlp_head(feats))
    stats = pooled_statistics(states, offsets)
    for name in STATISTICS:
        record(f"+ {name}", mlp_head(np.hstack([feats, stats[name]])))
    record("+ all four statistics", mlp_head(np.hstack([feats, *stats.values()])))
    record("attention pooling beside the MLP", fit_attention_heads(states, offsets, feats, y, cut, train, val, cfg))
    result = {
        "question": "Does the blend's Qwen reader head rank ChatGPT's val first turns better when it reads more of "
        "each prompt's token states than the last position and the mean?",
        "split": f"val only ({len(val)} ShareGPT first turns with ChatGPT's answers); the test split was not read",
        "how": "python benchmarks/decoder_pooling.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "decoder": args.decoder,
        "layers": layers,
        "token_layers": token_layers,
        "max_length": args.max_length,
        "train_prompts": len(train),
        "tokens_kept": int(offsets[-1]),
        "head_settings": cfg,
        "checkpoint": {"path": args.checkpoint, "val_tau_b": round(float(kendall_tau_b(ckpt, y[val])), 4)},
        "variants": variants,
        "reader_s": round(read_s, 1),
        "heads_s": round(time.perf_counter() - t1, 1),
    }
    if args.json:
        write_json(result, args.json)
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
