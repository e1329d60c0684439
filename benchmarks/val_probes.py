"""Cheap ideas for ranking one model's answers better, measured on its val split only.

Each probe reads the train and val prompts with their length labels (data/pairs, data/prompts) and
prints val Kendall tau_b; none reads the test split.

- `knn`: a nearest-neighbour regression: the mean log length of the k train prompts closest in
  TF-IDF cosine (word 1-2-grams), weighted by similarity^p; how many val prompts have a near twin in
  train; and that regression blended with a trained checkpoint's score (z-scored sum, the weight
  chosen on one random half of val and read on the other).
- `prior_features`: the TF-IDF + ridge of `train.lexical_prior` with dense prompt-shape features
  (log characters, words, lines, question marks, digits, a code fence) or character 2-4-grams added.
(Combining trained predictors by mean rank: benchmarks/val_ensembles.py.)

    python benchmarks/val_probes.py knn --model chatgpt --checkpoint models/chatgpt/pairwise
    python benchmarks/val_probes.py prior_features --model chatgpt

`--json F` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _splits(model: str, data_root: str):
    from pipeline.blend import member_splits

    split = member_splits([model], data_root)[model]
    return split["train"], split["val"]


def _z(a: np.ndarray) -> np.ndarray:
    return (a - a.mean()) / (a.std() or 1.0)  # constant scores stay constant


def _tau(scores, lengths) -> float:
    from pipeline.ranking.metrics import kendall_tau_b

    return round(float(kendall_tau_b(scores, lengths)), 4)


def _checkpoint_scores(path: str, texts: list[str]) -> np.ndarray:
    from pipeline.serving.scorer import Scorer

    return Scorer.from_pretrained(path).score(texts)


def knn(args) -> dict:
    from pipeline.ranking.lexical import TfidfRidge

    train, val = _splits(args.model, args.data)
    y_train, y_val = np.log1p(train["length"].to_numpy()), val["length"].to_numpy()
    vectorizer, x_train = TfidfRidge.vectorize(train["prompt"].tolist(), ngram_max=2, min_df=2)
    sim = (vectorizer.transform(val["prompt"].tolist()) @ x_train.T).toarray()
    order = np.argsort(-sim, axis=1)
    top = sim[np.arange(len(val)), order[:, 0]]
    out = {
        "val_prompts_with_a_train_twin": {
            "cosine>=0.9": round(float((top >= 0.9).mean()), 4),
            "cosine>=0.7": round(float((top >= 0.7).mean()), 4),
        },
        "knn_val_tau_b": {},
    }
    predictions = {}
    for k in args.k:
        idx = order[:, :k]
        near = np.take_along_axis(sim, idx, 1)
        for p in (1, 4):
            weight = np.maximum(near, 1e-6) ** p
            predictions[(k, p)] = (weight * y_train[idx]).sum(1) / weight.sum(1)
            out["knn_val_tau_b"][f"k{k}_p{p}"] = _tau(predictions[(k, p)], y_val)
    if args.checkpoint:
        encoder = _checkpoint_scores(args.checkpoint, val["prompt"].tolist())
        perm = np.random.default_rng(0).permutation(len(val))
        halves = [perm[: len(val) // 2], perm[len(val) // 2 :]]
        held_out = []
        for h in range(2):  # k, p and the weight chosen on one half, read on the other
            fit, read = halves[h], halves[1 - h]
            grid = {
                (kp, float(w)): _tau(w * _z(encoder[fit]) + (1 - w) * _z(pred[fit]), y_val[fit])
                for kp, pred in predictions.items()
                for w in np.round(np.arange(0.5, 1.001, 0.05), 2)
            }
            (k, p), w = max(grid, key=grid.get)
            pred = predictions[(k, p)]
            held_out.append(
                {
                    "knn": f"k{k}_p{p}",
                    "weight": w,
                    "blend_val_tau_b": _tau(w * _z(encoder[read]) + (1 - w) * _z(pred[read]), y_val[read]),
                    "checkpoint_val_tau_b": _tau(encoder[read], y_val[read]),
                }
            )
        out["blend_with_checkpoint"] = {
            "checkpoint": args.checkpoint,
            "checkpoint_val_tau_b": _tau(encoder, y_val),
            "held_out_halves": held_out,
        }
    return out


def _shape_features(texts) -> np.ndarray:
    rows = []
    for t in texts:
        n = len(t)
        rows.append(
            [
                np.log1p(n),
                np.log1p(len(t.split())),
                np.log1p(t.count("\n") + 1),
                np.log1p(t.count("?")),
                float("```" in t),
                np.log1p(sum(c.isdigit() for c in t)),
                np.log1p(n) ** 2,
            ]
        )
    return np.array(rows)


def prior_features(args) -> dict:
    import scipy.sparse as sp
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import Ridge

    train, val = _splits(args.model, args.data)
    y_train, y_val = np.log1p(train["length"].to_numpy()), val["length"].to_numpy()
    words = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    w_train, w_val = words.fit_transform(train["prompt"]), words.transform(val["prompt"])
    d_train, d_val = _shape_features(train["prompt"]), _shape_features(val["prompt"])
    mu, sd = d_train.mean(0), d_train.std(0) + 1e-9
    d_train, d_val = sp.csr_matrix((d_train - mu) / sd), sp.csr_matrix((d_val - mu) / sd)
    chars = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), min_df=3, sublinear_tf=True, max_features=300000)
    c_train, c_val = chars.fit_transform(train["prompt"]), chars.transform(val["prompt"])
    out: dict = {"words": {}, "words+shape": {}, "words+chars": {}}
    for alpha in args.alphas:
        fit = Ridge(alpha=alpha).fit(w_train, y_train)
        out["words"][str(alpha)] = _tau(fit.predict(w_val), y_val)
        for scale in (0.1, 1.0):
            fit = Ridge(alpha=alpha).fit(sp.hstack([w_train, scale * d_train]).tocsr(), y_train)
            out["words+shape"][f"{alpha}, scale {scale}"] = _tau(
                fit.predict(sp.hstack([w_val, scale * d_val]).tocsr()), y_val
            )
        fit = Ridge(alpha=alpha).fit(sp.hstack([w_train, c_train]).tocsr(), y_train)
        out["words+chars"][str(alpha)] = _tau(fit.predict(sp.hstack([w_val, c_val]).tocsr()), y_val)
    return out


PROBES = {"knn": knn, "prior_features": prior_features}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", choices=sorted(PROBES))
    ap.add_argument("--model", default="chatgpt", help="generation model whose val answers to rank")
    ap.add_argument("--data", default="data")
    ap.add_argument("--checkpoint", default=None, help="knn: a trained checkpoint dir to blend with")
    ap.add_argument("--k", type=lambda s: [int(x) for x in s.split(",")], default=[5, 10, 20, 50, 100])
    ap.add_argument("--alphas", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 3.0, 10.0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    result = {
        "probe": args.probe,
        "model": args.model,
        "split": "val",
        **PROBES[args.probe](args),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
