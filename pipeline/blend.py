"""blend: a trained encoder's score plus a TF-IDF + ridge regression, as one serving checkpoint.

On the val splits the encoder and the lexical regression rank differently enough that a weighted
sum of the two beats either (benchmarks/val_ensembles.py). This stage builds that sum for one
trained predictor (params `blend.predictors`: train model -> method):

1. TF-IDF + ridge on log1p(answer length), fitted on the train-split prompts of the models the
   predictor was trained on (its pars.json `trained_on.members`; labels from data/pairs);
2. its alpha, then the blend weight w, chosen on their val-split prompts: the grid point with the
   highest mean over those models of val tau_b (each model counts once, as in train_cross);
3. score = w * encoder / sd(encoder) + (1 - w) * lexical / sd(lexical), the sds over the val prompts.

The test split is never read. Writes models/<model>/<method>+tfidf/ (the source checkpoint, its
weights unchanged, plus the lexical files and pars.json `lexical`; `Scorer` applies the blend),
metrics/blend/<model>.json and plots/blend/<model>.png.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.params import load_params

SUFFIX = "+tfidf"  # models/<model>/<method>+tfidf: the blended checkpoint of models/<model>/<method>


def blended_method(method: str) -> str:
    return method + SUFFIX


def member_splits(members: list[str], data_root: str | Path) -> dict[str, dict[str, pd.DataFrame]]:
    """[member][split] = (prompt, length) of each labelled train/val prompt of a member."""
    from pipeline.ranking.data import RankingData

    out = {}
    for member in members:
        data = RankingData.load(member, data_root)
        labels = data.labels[data.labels["split"].isin(["train", "val"])]
        frame = pd.DataFrame(
            {
                "prompt_id": labels["prompt_id"].to_numpy(),
                "split": labels["split"].to_numpy(),
                "prompt": labels["prompt_id"].map(data.texts).to_numpy(),
                "length": labels["length"].to_numpy(dtype=float),
            }
        )
        out[member] = {split: frame[frame["split"] == split].reset_index(drop=True) for split in ("train", "val")}
        if len(out[member]["val"]) < 2:
            raise ValueError(
                f"blend: {member} has {len(out[member]['val'])} labelled val prompts; need 2 to choose on val"
            )
    return out


def mean_val_tau(score_of: dict[str, np.ndarray], splits: dict) -> tuple[float, dict[str, float]]:
    """(mean over members, per member) val tau_b of per-member scores."""
    from pipeline.ranking.metrics import kendall_tau_b

    per = {m: float(kendall_tau_b(score_of[m], splits[m]["val"]["length"].to_numpy())) for m in splits}
    return float(np.nanmean(list(per.values()))), per


def fit_blend(
    members: list[str], splits: dict, encoder_val: dict[str, np.ndarray], settings: dict
) -> tuple[object, dict]:
    """(lexical model, facts): alpha and w chosen on val as the module says."""
    from pipeline.ranking.lexical import TfidfRidge

    tfidf = settings["tfidf"]
    train = pd.concat([splits[m]["train"] for m in members], ignore_index=True)
    alphas = [float(a) for a in tfidf["alphas"]]
    weights = [float(w) for w in settings["encoder_weights"]]
    if not alphas or not weights or not all(0.0 <= w <= 1.0 for w in weights):
        raise ValueError("params blend: tfidf.alphas must be non-empty and encoder_weights a non-empty grid in [0, 1]")
    fits = TfidfRidge.fit_grid(
        train["prompt"].tolist(),
        train["length"].to_numpy(),
        alphas=alphas,
        ngram_max=int(tfidf["ngram_max"]),
        min_df=int(tfidf["min_df"]),
    )
    alpha_rows = []
    for alpha, fit in zip(alphas, fits):
        lexical_val = {m: fit.predict(splits[m]["val"]["prompt"].tolist()) for m in members}
        mean, per = mean_val_tau(lexical_val, splits)
        alpha_rows.append({"alpha": alpha, "val_tau_b": mean, "per_model": per, "scores": lexical_val})
    best = max(alpha_rows, key=lambda r: (r["val_tau_b"], -alphas.index(r["alpha"])))
    lexical, lexical_val = fits[alpha_rows.index(best)], best["scores"]

    sd_encoder = float(np.std(np.concatenate([encoder_val[m] for m in members])))
    sd_lexical = float(np.std(np.concatenate([lexical_val[m] for m in members])))
    if not (sd_encoder > 0 and sd_lexical > 0 and math.isfinite(sd_encoder) and math.isfinite(sd_lexical)):
        raise ValueError(
            f"blend: constant val scores (sd encoder {sd_encoder}, lexical {sd_lexical}); nothing to blend"
        )
    grid = []
    for w in weights:
        blended = {m: w * encoder_val[m] / sd_encoder + (1 - w) * lexical_val[m] / sd_lexical for m in members}
        mean, per = mean_val_tau(blended, splits)
        grid.append({"encoder_weight": w, "val_tau_b": mean, "per_model": per})
    chosen = max(grid, key=lambda r: (r["val_tau_b"], r["encoder_weight"]))  # ties: more encoder
    w = chosen["encoder_weight"]
    facts = {
        "members": members,
        "n_train_prompts": {m: int(len(splits[m]["train"])) for m in members},
        "n_val_prompts": {m: int(len(splits[m]["val"])) for m in members},
        "alpha": best["alpha"],
        "alpha_grid": [{k: r[k] for k in ("alpha", "val_tau_b", "per_model")} for r in alpha_rows],
        "sd_encoder": sd_encoder,
        "sd_lexical": sd_lexical,
        "encoder_weight_grid": grid,
        "w": w,
        "encoder_weight": w / sd_encoder,
        "lexical_weight": (1 - w) / sd_lexical,
        "val_tau_b": chosen["val_tau_b"],
        "val_tau_b_per_model": chosen["per_model"],
        "encoder_val_tau_b": mean_val_tau(encoder_val, splits)[0],
        "lexical_val_tau_b": best["val_tau_b"],
    }
    return lexical, facts


def write_plot(facts: dict, name: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = facts["encoder_weight_grid"]
    w = [r["encoder_weight"] for r in grid]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for member in facts["members"]:
        ax.plot(w, [r["per_model"][member] for r in grid], marker=".", lw=1, label=member)
    ax.plot(w, [r["val_tau_b"] for r in grid], color="black", lw=2.2, label="mean (the choice)")
    ax.axvline(facts["w"], color="gray", ls="--", lw=1)
    ax.set_xlabel("w: weight of the encoder (0 = TF-IDF + ridge alone, 1 = encoder alone)")
    ax.set_ylabel("val Kendall tau_b")
    ax.set_title(
        f"blend of {name}: encoder + TF-IDF ridge (alpha {facts['alpha']:g})\nchosen on val: w = {facts['w']:g}",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def run(
    model: str,
    params: dict,
    *,
    data_root: str | Path = "data",
    models_root: str | Path = "models",
    metrics_dir: str | Path = "metrics/blend",
    plots_dir: str | Path = "plots/blend",
) -> dict:
    from pipeline.contracts import predictor_dir, write_json
    from pipeline.ranking.checkpoint import LEXICAL, attach_lexical, copy_checkpoint, read_meta
    from pipeline.serving.scorer import Scorer

    t0 = time.perf_counter()
    predictors = params["predictors"] or {}
    if model not in predictors:
        raise KeyError(f"params blend.predictors has no entry {model!r} (it has {sorted(predictors)})")
    method = predictors[model]
    src = predictor_dir(model, method, models_root)
    meta = read_meta(src)
    if LEXICAL in meta:
        raise ValueError(f"blend: {src} already adds a lexical model to its score (a blend, or train's lexical_prior)")
    trained_on = meta.get("trained_on") or {}
    members = list(trained_on.get("members") or [trained_on.get("model") or model])
    splits = member_splits(members, data_root)

    print(f"blend: scoring the val prompts of {', '.join(members)} with {src}", flush=True)
    scorer = Scorer.from_pretrained(src)
    encoder_val = {m: scorer.score(splits[m]["val"]["prompt"].tolist(), progress=True).astype(float) for m in members}
    print(f"blend: fitting TF-IDF + ridge on {sum(len(s['train']) for s in splits.values())} train prompts", flush=True)
    lexical, facts = fit_blend(members, splits, encoder_val, params)

    dst = predictor_dir(model, blended_method(method), models_root)
    copy_checkpoint(src, dst, method=blended_method(method))  # weights copied and re-hashed
    attach_lexical(
        dst,
        lexical,
        encoder_weight=facts["encoder_weight"],
        lexical_weight=facts["lexical_weight"],
        alpha=facts["alpha"],
        w=facts["w"],
        chosen_on="val split: mean over trained_on.members of val tau_b",
        val_tau_b=facts["val_tau_b"],
        encoder_val_tau_b=facts["encoder_val_tau_b"],
    )
    # the stage's own acceptance test: the serving loader takes the result and reproduces the val blend
    check = Scorer.from_pretrained(dst).score(splits[members[0]]["val"]["prompt"].tolist()[:64])
    expected = facts["encoder_weight"] * encoder_val[members[0]][:64] + facts["lexical_weight"] * lexical.predict(
        splits[members[0]]["val"]["prompt"].tolist()[:64]
    )
    if not np.allclose(check, expected, rtol=1e-3, atol=1e-3):
        raise ValueError(f"blend: {dst} does not score as the blend chosen on val")

    facts = {"model": model, "method": method, "checkpoint": str(dst), **facts}
    facts["stage_wall_s"] = round(time.perf_counter() - t0, 2)
    write_json(facts, Path(metrics_dir) / f"{model}.json")
    write_plot(facts, f"{model}/{method}", Path(plots_dir) / f"{model}.png")
    print(
        f"blend: {dst}: w={facts['w']:g} (alpha {facts['alpha']:g}); mean val tau_b {facts['val_tau_b']:.3f} "
        f"(encoder alone {facts['encoder_val_tau_b']:.3f}, TF-IDF alone {facts['lexical_val_tau_b']:.3f}); "
        f"{facts['stage_wall_s']:.0f} s",
        flush=True,
    )
    return facts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pars blend", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a train model of params blend.predictors")
    ap.add_argument("--params", default=None, help="params file (default params.yaml)")
    ap.add_argument("--data", default="data")
    ap.add_argument("--models", default="models", help="models root (reads and writes <root>/<model>/...)")
    ap.add_argument("--metrics", default="metrics/blend")
    ap.add_argument("--plots", default="plots/blend")
    args = ap.parse_args(argv)
    run(
        args.model,
        load_params("blend", args.params),
        data_root=args.data,
        models_root=args.models,
        metrics_dir=args.metrics,
        plots_dir=args.plots,
    )
    return 0
