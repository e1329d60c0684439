"""Which order serves a burst best when lengths are uncertain? Val only.

A burst's mean per-token latency sums wait / answer length. For one server, the order that
minimises the expected sum of completion / length, with lengths o unknown, is by E[o] / E[1/o]
(the swap argument: j ahead of i costs i about o_j / o_i), not by the most likely length: a prompt
with a small chance of a one-word answer belongs earlier than its typical length says; on val, ten
such short answers carry 41% of the predictor's excess over oracle SJF (docs/choices.md, "A few
replies carry the gap to oracle").

This fits, on the decoder features of the blend's reader (ChatGPT train first turns), a
distributional head: `--seeds` MLPs whose softmax over answer-length bins (fixed edges, fine at
the short end) is trained with cross-entropy, averaged. From it, per val prompt, E[o] and E[1/o]
(each bin's train mean of o and 1/o). Keys compared on ChatGPT's val burst (the simulator with
`simulate.engine`, as benchmarks/val_serving.py):

- `served`: the given checkpoint's score (default the blend, `chatgpt/pairwise+decoder`),
- `wsept`: log E[o] - log E[1/o] of the distributional head alone (`expected_length`: log E[o]),
- `served+short(g)`: (1 - g) z(served) + g z(-log E[1/o]), for g in `--gammas`,
- `served+prompt(g)`: (1 - g) z(served) + g z(log prompt tokens): a long prompt holds more KV cache.

g is chosen on the whole val burst (what a stage would do) and also cross-fitted: chosen on one
random half's burst, scored on the other's, both ways (so no figure is scored where it was
chosen). Prints and writes tau_b, mean / p90 speedup over FCFS and gap to oracle of each key.

    python benchmarks/serving_key.py --features-cache /tmp/qwen.npz --json /tmp/serving_key.json

Needs `dvc repro blend@chatgpt`. The decoder features (layers 8/12/16 of the blend's reader, its
layers when this was measured; every ChatGPT train and val first turn) come from `--features-cache`
when it holds them (the format of benchmarks/decoder_features.py, which can share it), else the
decoder computes and writes them there (about 10-15 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decoder_features import add_reader_flags, features_of, zscore  # noqa: E402

from pipeline.cli import comma_numbers  # noqa: E402
from pipeline.contracts import generations_path, labels_path, prompts_path, write_json  # noqa: E402
from pipeline.params import load_params  # noqa: E402
from pipeline.ranking.metrics import kendall_tau_b  # noqa: E402

# answer-length bins, tokens, (lo, hi]: fine where a late answer costs most per token
EDGES = (0, 2, 5, 10, 20, 40, 70, 100, 150, 200, 275, 350, 450, 600, 800, 1100, np.inf)


def fit_bins(x_train, o_train, x_val, *, seeds=5, epochs=3, hidden=256, lr=3e-4, batch_size=64) -> np.ndarray:
    """Val probabilities over EDGES' bins: the mean of `seeds` MLPs (the blend head's architecture and
    schedule) trained with cross-entropy on the bin of each train answer."""
    import torch

    from pipeline.ranking.decoder import train_mlp

    mean, scale = x_train.mean(0), x_train.std(0)
    scale[scale == 0] = 1.0
    z = torch.from_numpy(((x_train - mean) / scale).astype(np.float32))
    zv = torch.from_numpy(((x_val - mean) / scale).astype(np.float32))
    target = torch.from_numpy(np.digitize(o_train, EDGES[1:-1], right=True)).long()
    n_bins = len(EDGES) - 1
    probs = np.zeros((len(zv), n_bins))
    for k in range(seeds):
        net = train_mlp(
            z,
            lambda out, rows: torch.nn.functional.cross_entropy(out, target[rows]),
            out_dim=n_bins,
            epochs=epochs,
            hidden=hidden,
            lr=lr,
            batch_size=batch_size,
            seed=k,
        )
        net.eval()
        with torch.no_grad():
            probs += torch.softmax(net(zv), 1).double().numpy()
        print(f"serving_key: bin head {k + 1}/{seeds}", file=sys.stderr, flush=True)
    return probs / seeds


def bin_moments(o_train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each bin's train mean of o and of 1/o (a bin no train answer falls in: its midpoint)."""
    b = np.digitize(o_train, EDGES[1:-1], right=True)
    m1, minv = [], []
    for k in range(len(EDGES) - 1):
        o = o_train[b == k]
        mid = EDGES[k + 1] if np.isfinite(EDGES[k + 1]) else 2 * EDGES[k]
        m1.append(o.mean() if o.size else mid)
        minv.append((1.0 / o).mean() if o.size else 1.0 / mid)
    return np.array(m1), np.array(minv)


def serve(keys: dict, s, o, idx, cfg) -> dict:
    """Mean / p90 per-token latency of a burst of the requests `idx` under each key (lower first)."""
    from pipeline.queueing.policies import on_pars_scheduler
    from pipeline.queueing.simulator import burst, simulate

    arrival = burst(idx.size)
    out = {}
    for name, key in keys.items():
        k = arrival.copy() if key is None else key[idx]
        r = simulate(arrival, s[idx], o[idx], key=k, config=cfg, sort_running=on_pars_scheduler(name))
        out[name] = {"mean": float(r.per_token.mean()), "p90": float(np.quantile(r.per_token, 0.9))}
    return out


def table(served: dict, keys: dict, o, idx) -> dict:
    fcfs, oracle = served["fcfs"], served["oracle"]
    return {
        name: {
            "kendall_tau_b": round(float(kendall_tau_b(np.arange(idx.size) if key is None else key[idx], o[idx])), 4),
            "mean_per_token_latency": round(r["mean"], 5),
            "speedup_mean_over_fcfs": round(fcfs["mean"] / r["mean"], 3),
            "speedup_p90_over_fcfs": round(fcfs["p90"] / r["p90"], 3),
            "times_oracle_mean": round(r["mean"] / oracle["mean"], 3),
        }
        for name, r in served.items()
        for key in [keys[name]]
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_reader_flags(ap, layers="8,12,16", cache_required=True)
    ap.add_argument("--checkpoint", default="models/chatgpt/pairwise+decoder", help="the served predictor")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--gammas", type=comma_numbers(float), default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.8,1")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    layers, gammas = sorted(set(args.layers)), args.gammas
    for path in (prompts_path(args.data), labels_path("chatgpt", args.data), Path(args.checkpoint) / "pars.json"):
        if not Path(path).exists():
            sys.exit(f"serving_key: {path} is missing (dvc repro blend@chatgpt)")

    import torch

    from pipeline.queueing.simulator import EngineConfig
    from pipeline.serving.scorer import Scorer

    torch.set_num_threads(2)
    prompts = pd.read_parquet(prompts_path(args.data))
    labels = pd.read_parquet(labels_path("chatgpt", args.data))
    rows = prompts[prompts["dataset"] == "sharegpt"][["prompt_id", "prompt"]].merge(
        labels[["prompt_id", "split", "length", "truncated"]], on="prompt_id"
    )
    train = rows[(rows["split"] == "train") & (rows["length"] > 0)]
    # the val burst: as benchmarks/val_serving.py, one answer per val prompt from generations
    gens = pd.read_parquet(generations_path("chatgpt", args.data))
    val = (
        rows[rows["split"] == "val"]
        .merge(
            gens[(gens.output_tokens > 0) & (gens.prompt_tokens > 0)].drop_duplicates("prompt_id")[
                ["prompt_id", "prompt_tokens", "output_tokens"]
            ],
            on="prompt_id",
        )
        .reset_index(drop=True)
    )
    ids = train["prompt_id"].tolist() + val["prompt_id"].tolist()
    texts = train["prompt"].tolist() + val["prompt"].tolist()
    feats, _, _, where = features_of(args.decoder, layers, args.max_length, 16, ids, texts, args.features_cache)
    x_train, x_val = feats[: len(train)], feats[len(train) :]
    o_train = train["length"].to_numpy(float)
    s, o = val["prompt_tokens"].to_numpy(np.int64), val["output_tokens"].to_numpy(np.int64)
    print(f"serving_key: {len(train)} train, {len(val)} val prompts; features from {where}", file=sys.stderr)

    served_score = np.asarray(
        Scorer.from_pretrained(args.checkpoint).score(val["prompt"].tolist(), progress=True), dtype=float
    )
    probs = fit_bins(x_train, o_train, x_val, seeds=args.seeds)
    m1, minv = bin_moments(o_train)
    e_o, e_inv = probs @ m1, probs @ minv
    short = -np.log(e_inv)  # higher = fewer short answers expected
    keys = {"fcfs": None, "oracle": o.astype(float), "served": served_score, "wsept": np.log(e_o) - np.log(e_inv)}
    keys["expected_length"] = np.log(e_o)
    for g in gammas:
        keys[f"served+short({g})"] = (1 - g) * zscore(served_score) + g * zscore(short)
    for g in (0.1, 0.2, 0.3):  # the scheduler knows the prompt: its KV share weighs on the queue too
        keys[f"served+prompt({g})"] = (1 - g) * zscore(served_score) + g * zscore(np.log(s))

    cfg = EngineConfig.from_dict(load_params("simulate")["engine"])
    everyone = np.arange(len(val))
    whole = table(serve(keys, s, o, everyone, cfg), keys, o, everyone)
    best_g = min(gammas, key=lambda g: whole[f"served+short({g})"]["times_oracle_mean"])

    half = np.random.default_rng(0).random(len(val)) < 0.5
    cross = []
    for choose, score in ((half, ~half), (~half, half)):
        ci, si = np.flatnonzero(choose), np.flatnonzero(score)
        picked = table(serve(keys, s, o, ci, cfg), keys, o, ci)
        g = min(gammas, key=lambda g: picked[f"served+short({g})"]["times_oracle_mean"])
        scored = table(serve(keys, s, o, si, cfg), keys, o, si)
        cross.append(
            {
                "chosen_gamma": g,
                "served_times_oracle": scored["served"]["times_oracle_mean"],
                "chosen_times_oracle": scored[f"served+short({g})"]["times_oracle_mean"],
                "served_speedup_mean": scored["served"]["speedup_mean_over_fcfs"],
                "chosen_speedup_mean": scored[f"served+short({g})"]["speedup_mean_over_fcfs"],
            }
        )

    print(f"\n{'key':<24} {'tau_b':>6} {'mean x':>7} {'p90 x':>7} {'x oracle':>8}")
    for name, r in whole.items():
        print(
            f"{name:<24} {r['kendall_tau_b']:>6.3f} {r['speedup_mean_over_fcfs']:>7.2f} "
            f"{r['speedup_p90_over_fcfs']:>7.2f} {r['times_oracle_mean']:>8.3f}"
        )
    print(f"chosen on the whole val burst: gamma {best_g}; cross-fitted halves: {cross}")
    if args.json:
        write_json(
            {
                "what": "serving keys under length uncertainty (E[o]/E[1/o]) on ChatGPT's val burst; val only",
                "command": "python benchmarks/serving_key.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                "checkpoint": args.checkpoint,
                "bins": [float(e) for e in EDGES],
                "train_prompts": len(train),
                "val_requests": len(val),
                "whole_val": whole,
                "gamma_chosen_on_whole_val": best_g,
                "cross_fit_halves": cross,
            },
            args.json,
        )
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
