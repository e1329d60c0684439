"""blend: a trained predictor's score plus a second regression of answer length, as one serving checkpoint.

On the val splits the encoder and a regression on other features rank differently enough that a
weighted sum of the two beats either (benchmarks/val_ensembles.py, benchmarks/decoder_features.py).
This stage builds that sum for one trained predictor (params `blend.predictors`: train model ->
method), with the regression named by `blend.features`:

- tfidf: TF-IDF + ridge on log1p(answer length) (for predictors trained without train.lexical_prior);
- decoder: a head on a frozen causal LM's hidden states (`pipeline.ranking.decoder`; the default reads
  Qwen2.5-Coder-0.5B-Instruct): a different model's view of the prompt, added on top of whatever the
  predictor's score already holds (its lexical prior included). `decoder.head`: a ridge, or a pairwise
  head (small MLPs trained with PARS's pairwise loss, averaged over seeds).

1. the regression is fitted on the train-split prompts of the models the predictor was trained on
   (its pars.json `trained_on.members`; labels from data/pairs; the decoder's on at most
   `decoder.max_train_prompts` of them, a seeded draw: its features cost a forward pass each);
2. its alpha (a pairwise head has none), then the blend weight w, chosen on their val-split prompts:
   the grid point with the highest mean over those models of val tau_b (each model counts once, as in
   train_cross);
3. score = w * predictor / sd(predictor) + (1 - w) * regression / sd(regression), the sds over the
   val prompts.

The test split is never read. Writes models/<model>/<method>+<features>/ (the source checkpoint, its
weights unchanged, plus the regression's files and pars.json `lexical` or `decoder`; `Scorer` applies
the blend), metrics/blend/<model>.json and plots/blend/<model>.png.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.contracts import write_figure
from pipeline.errors import PARSError
from pipeline.params import PARAMS_HELP, Section, load_params, number_list
from pipeline.ranking.decoder import HEADS

FEATURES = ("tfidf", "decoder")  # blend.features: what the second regression reads


def blended_method(method: str, features: str = "tfidf") -> str:
    """models/<model>/<method>+<features>: the blended checkpoint of models/<model>/<method>."""
    return f"{method}+{features}"


def check_params(model: str, params, machine: bool = True) -> tuple[str, str]:
    """The blend section checked before anything loads or is scored (one line naming the key):
    (the method of `model` to blend, the features). `machine=False` (`pars profile`): the decoder
    dir need not be materialized yet."""
    sec = params if isinstance(params, Section) else Section(params, "params: blend")
    sec.only(("predictors", "features", "tfidf", "decoder", "encoder_weights"))
    predictors = sec.mapping("predictors")
    if model not in predictors:
        raise KeyError(f"{sec.where}.predictors has no entry {model!r} (it has {sorted(map(str, predictors))})")
    method = predictors[model]
    if not isinstance(method, str) or not method or "/" in method or method.startswith("."):
        raise PARSError(f"{sec.where}.predictors.{model} {method!r}: must be a method name (e.g. pairwise)")
    features = sec["features"]
    if features not in FEATURES:
        raise ValueError(f"{sec.where}.features {features!r}: expected one of {list(FEATURES)}")
    weight_grid(sec)
    if features == "decoder":
        decoder_settings(sec["decoder"], f"{sec.where}.decoder", machine)
    else:
        tfidf = sec.mapping("tfidf")
        tfidf = tfidf if isinstance(tfidf, Section) else Section(tfidf, f"{sec.where}.tfidf")
        tfidf.only(("ngram_max", "min_df", "alphas"))
        tfidf.integer("ngram_max", minimum=1)
        tfidf.integer("min_df", minimum=1)
        number_list(tfidf["alphas"], f"{tfidf.where}.alphas", positive=True)
    return method, features


def member_splits(members: list[str], data_root: str | Path) -> dict[str, dict[str, pd.DataFrame]]:
    """[member][split] = (prompt_id, dataset, prompt, length, truncated) of each labelled train/val prompt of a member."""
    from pipeline.contracts import PROMPTS, prompts_path, read_table
    from pipeline.ranking.data import RankingData

    out = {}
    dataset_of = read_table(prompts_path(data_root), PROMPTS).set_index("prompt_id")["dataset"]
    for member in members:
        data = RankingData.load(member, data_root)
        labels = data.labels[data.labels["split"].isin(["train", "val"])]
        frame = pd.DataFrame(
            {
                "prompt_id": labels["prompt_id"].to_numpy(),
                "split": labels["split"].to_numpy(),
                "dataset": labels["prompt_id"].map(dataset_of).to_numpy(),
                "prompt": labels["prompt_id"].map(data.texts).to_numpy(),
                "length": labels["length"].to_numpy(dtype=float),
                "truncated": labels["truncated"].to_numpy(dtype=bool),
            }
        )
        out[member] = {split: frame[frame["split"] == split].reset_index(drop=True) for split in ("train", "val")}
        if len(out[member]["val"]) < 2:
            raise ValueError(
                f"blend: {member} has {len(out[member]['val'])} labelled val prompts; need 2 to choose on val"
            )
        if out[member]["val"]["length"].nunique() < 2:  # its val tau_b is undefined: it could not count
            raise ValueError(
                f"blend: every labelled val prompt of {member} has the same length; "
                f"its val tau_b is undefined, so it cannot count in the choice of alpha and w"
            )
    return out


def mean_val_tau(score_of: dict[str, np.ndarray], splits: dict) -> tuple[float, dict[str, float]]:
    """(mean over members, per member) val tau_b of per-member scores."""
    from pipeline.ranking.metrics import kendall_tau_b

    per = {m: float(kendall_tau_b(score_of[m], splits[m]["val"]["length"].to_numpy())) for m in splits}
    # not nanmean: a member whose tau_b is undefined (constant scores) would silently drop out of the
    # mean; the mean is undefined instead, and `best` never picks it
    return float(np.mean(list(per.values()))), per


def best(rows: list[dict], tie_break) -> dict:
    """The grid row with the highest mean val tau_b (ties: `tie_break`); a row whose mean is undefined
    (a member's scores constant) loses to any defined one, and if every row's is, one line names them."""
    defined = [r for r in rows if not math.isnan(r["val_tau_b"])]
    if not defined:
        undefined = sorted({m for r in rows for m, tau in r["per_model"].items() if math.isnan(tau)})
        raise ValueError(
            f"blend: val tau_b is undefined at every grid point: constant val scores for {', '.join(undefined)}"
        )
    return max(defined, key=lambda r: (r["val_tau_b"], tie_break(r)))


def fit_blend(
    members: list[str], splits: dict, encoder_val: dict[str, np.ndarray], settings: dict
) -> tuple[object, dict]:
    """(lexical model, facts): alpha and w chosen on val as the module says."""
    from pipeline.ranking.lexical import TfidfRidge

    tfidf = settings["tfidf"]
    train = pd.concat([splits[m]["train"] for m in members], ignore_index=True)
    where = f"{getattr(tfidf, 'where', 'params: blend.tfidf')}.alphas"
    alphas = number_list(tfidf["alphas"], where, positive=True)
    weights = weight_grid(settings)
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
    chosen = best(alpha_rows, lambda r: -alphas.index(r["alpha"]))
    lexical, lexical_val = fits[alpha_rows.index(chosen)], chosen["scores"]
    facts = {
        "members": members,
        "n_train_prompts": {m: int(len(splits[m]["train"])) for m in members},
        "n_val_prompts": {m: int(len(splits[m]["val"])) for m in members},
        "alpha": chosen["alpha"],
        "alpha_grid": [{k: r[k] for k in ("alpha", "val_tau_b", "per_model")} for r in alpha_rows],
    }
    choice = choose_weight(members, splits, encoder_val, lexical_val, weights)
    facts.update(
        {
            "sd_encoder": choice["sd_encoder"],
            "sd_lexical": choice["sd_added"],
            "encoder_weight_grid": choice["grid"],
            "w": choice["w"],
            "encoder_weight": choice["encoder_weight"],
            "lexical_weight": choice["added_weight"],
            "val_tau_b": choice["val_tau_b"],
            "val_tau_b_per_model": choice["per_model"],
            "encoder_val_tau_b": mean_val_tau(encoder_val, splits)[0],
            "lexical_val_tau_b": chosen["val_tau_b"],
        }
    )
    return lexical, facts


def weight_grid(settings: dict) -> list[float]:
    """blend.encoder_weights, checked before any fitting: a non-empty grid in [0, 1]."""
    where = f"{getattr(settings, 'where', 'params: blend')}.encoder_weights"
    return number_list(settings["encoder_weights"], where, minimum=0, maximum=1)


def choose_weight(
    members: list[str], splits: dict, encoder_val: dict[str, np.ndarray], added_val: dict[str, np.ndarray], weights
) -> dict:
    """The grid weight w of w * encoder/sd + (1 - w) * added/sd with the best mean val tau_b."""
    sd_encoder = float(np.std(np.concatenate([encoder_val[m] for m in members])))
    sd_added = float(np.std(np.concatenate([added_val[m] for m in members])))
    if not (sd_encoder > 0 and sd_added > 0 and math.isfinite(sd_encoder) and math.isfinite(sd_added)):
        raise ValueError(
            f"blend: constant val scores (sd encoder {sd_encoder}, regression {sd_added}); nothing to blend"
        )
    grid = []
    for w in weights:
        blended = {m: w * encoder_val[m] / sd_encoder + (1 - w) * added_val[m] / sd_added for m in members}
        mean, per = mean_val_tau(blended, splits)
        grid.append({"encoder_weight": w, "val_tau_b": mean, "per_model": per})
    chosen = best(grid, lambda r: r["encoder_weight"])  # ties: more encoder
    w = chosen["encoder_weight"]
    return {
        "sd_encoder": sd_encoder,
        "sd_added": sd_added,
        "grid": grid,
        "w": w,
        "encoder_weight": w / sd_encoder,
        "added_weight": (1 - w) / sd_added,
        "val_tau_b": chosen["val_tau_b"],
        "per_model": chosen["per_model"],
    }


def decoder_settings(raw, where: str = "params: blend.decoder", machine: bool = True) -> dict:
    """blend.decoder as checked values (ValueError naming the key); `machine=False`: the path is
    not looked for."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {raw!r}")
    keys = ("path", "layers", "max_length", "max_train_prompts", "batch_size")
    Section(raw, where).only((*keys, "datasets", "head", "alphas", "pairwise_head"))
    head = raw.get("head", "ridge")
    if not isinstance(head, str) or head not in HEADS:
        raise ValueError(f"{where}.head {head!r}: expected one of {list(HEADS)}")
    keys += ("alphas",) if head == "ridge" else ("pairwise_head",)
    missing = [k for k in keys if k not in raw]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)} (head: {head})")
    layers = raw["layers"]
    if not isinstance(layers, list) or not layers or not all(_integer(k) and k >= 1 for k in layers):
        raise ValueError(f"{where}.layers {layers!r}: expected a list of layer numbers >= 1")
    # checked wherever set: a bad ridge setting fails even while the pairwise head leaves it unread
    alphas = number_list(raw["alphas"], f"{where}.alphas", positive=True) if "alphas" in raw else None
    pairwise = pairwise_head_settings(raw["pairwise_head"], f"{where}.pairwise_head") if head == "pairwise" else None
    for key, least in (("max_length", 8), ("batch_size", 1), ("max_train_prompts", 2)):
        value = raw[key]
        if not _integer(value) or value < least:
            raise ValueError(f"{where}.{key} {value!r}: expected an integer >= {least}")
    datasets = raw.get("datasets")  # the ridge's train prompts from these datasets only; null: all
    if datasets is not None and not (
        isinstance(datasets, list) and datasets and all(isinstance(d, str) and d for d in datasets)
    ):
        raise ValueError(f"{where}.datasets {datasets!r}: expected a list of dataset names, or null for all")
    path = raw["path"]
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where}.path {path!r}: expected a directory or a hub id")
    local = Path(path)
    checked = {**raw, "head": head, "alphas": alphas, "pairwise_head": pairwise}
    if not machine:
        return checked
    if local.exists() and not (local / "config.json").is_file():
        raise ValueError(f"{where}.path {path}: not a Hugging Face model directory (no config.json)")
    if not local.exists() and (path.startswith((".", "/")) or path.count("/") != 1):
        raise ValueError(f"{where}.path {path}: no such directory (dvc repro materialize makes models/base/)")
    return checked


def pairwise_head_settings(raw, where: str) -> dict:
    """blend.decoder.pairwise_head as DecoderMLPHead.fit's keyword arguments (one line naming the key)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {raw!r}")
    sec = raw if isinstance(raw, Section) else Section(raw, where)
    sec.only(("seeds", "epochs", "hidden", "lr", "batch_size", "delta", "margin", "margin_per_log_length"))
    return {
        "seeds": sec.integer("seeds", minimum=1),
        "epochs": sec.integer("epochs", minimum=1),
        "hidden": sec.integer("hidden", minimum=1),
        "lr": sec.number("lr", positive=True),
        "batch_size": sec.integer("batch_size", minimum=2),
        "delta": sec.number("delta", minimum=0, below=1),
        "margin": sec.number("margin", minimum=0),
        "margin_per_log_length": sec.number("margin_per_log_length", minimum=0),
    }


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_decoder(settings: dict):
    """The DecoderFeatures of blend.decoder, loaded before any scoring: a decoder without a chat
    template, with fewer layers than `layers` reads, or of another architecture fails in seconds,
    in one line naming blend.decoder.path."""
    from pipeline.ranking.decoder import DecoderFeatures

    cfg = decoder_settings(settings["decoder"])
    where = f"{getattr(settings['decoder'], 'where', 'params: blend.decoder')}.path"
    try:
        return DecoderFeatures.load(cfg["path"], cfg["layers"], cfg["max_length"])
    except (ValueError, OSError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def fit_decoder_blend(
    members: list[str],
    splits: dict,
    encoder_val: dict[str, np.ndarray],
    settings: dict,
    seed: int = 0,
    decoder=None,
) -> tuple[object, dict]:
    """(DecoderPrior, facts): the decoder head (a ridge, its alpha chosen on val; or a pairwise head,
    its settings fixed in params), then w, chosen on val as the module says
    (`decoder`: the DecoderFeatures load_decoder gives, loaded here if not given)."""
    from pipeline.ranking.decoder import DecoderMLPHead, DecoderPrior, DecoderRidge

    cfg = decoder_settings(settings["decoder"])
    weights = weight_grid(settings)
    train = pd.concat([splits[m]["train"] for m in members], ignore_index=True)
    if cfg.get("datasets") is not None:
        train = train[train["dataset"].isin(cfg["datasets"])].reset_index(drop=True)
        if len(train) < 2:
            raise ValueError(
                f"blend.decoder.datasets {cfg['datasets']}: {len(train)} train prompt(s) of {', '.join(members)} "
                f"come from them; the ridge needs at least 2"
            )
    if len(train) > cfg["max_train_prompts"]:
        train = train.sample(n=cfg["max_train_prompts"], random_state=seed).reset_index(drop=True)
    decoder = decoder if decoder is not None else load_decoder(settings)
    t0 = time.perf_counter()
    print(f"blend: decoder features of {len(train)} train prompts ({cfg['path']})", flush=True)
    x_train = decoder.embed(train["prompt"].tolist(), cfg["batch_size"], progress=True)
    x_val = {m: decoder.embed(splits[m]["val"]["prompt"].tolist(), cfg["batch_size"]) for m in members}
    embed_s = time.perf_counter() - t0
    if cfg["head"] == "ridge":  # its alpha chosen on val
        fits = DecoderRidge.fit_grid(x_train, train["length"].to_numpy(), cfg["alphas"])
        alpha_rows = []
        for alpha, fit in zip(cfg["alphas"], fits):
            mean, per = mean_val_tau({m: fit.predict(x_val[m]) for m in members}, splits)
            alpha_rows.append({"alpha": alpha, "val_tau_b": mean, "per_model": per})
        chosen = best(alpha_rows, lambda r: -cfg["alphas"].index(r["alpha"]))
        head = fits[alpha_rows.index(chosen)]
    else:  # settings fixed in params (chosen on val by benchmarks/decoder_features.py); val picks only w
        print(f"blend: pairwise head on {len(train)} train prompts ({cfg['pairwise_head']})", flush=True)
        head = DecoderMLPHead.fit(
            x_train,
            train["length"].to_numpy(),
            train["truncated"].to_numpy(),
            **cfg["pairwise_head"],
            seed=seed,
            progress=True,
        )
    val_scores = {m: head.predict(x_val[m]) for m in members}
    if cfg["head"] != "ridge":
        alpha_rows, chosen = [], {"alpha": None, "val_tau_b": mean_val_tau(val_scores, splits)[0]}
    choice = choose_weight(members, splits, encoder_val, val_scores, weights)
    n_embedded = len(train) + sum(len(splits[m]["val"]) for m in members)
    facts = {
        "members": members,
        "n_train_prompts": {m: int(len(splits[m]["train"])) for m in members},
        "n_decoder_train_prompts": int(len(train)),
        "n_val_prompts": {m: int(len(splits[m]["val"])) for m in members},
        "decoder": {k: cfg[k] for k in ("path", "layers", "max_length", "head")},
        "pairwise_head": cfg["pairwise_head"],
        "decoder_train_datasets": cfg.get("datasets"),
        "decoder_prompts_per_s": round(n_embedded / embed_s, 2) if embed_s > 0 else None,
        "alpha": chosen["alpha"],
        "alpha_grid": alpha_rows,
        "sd_encoder": choice["sd_encoder"],
        "sd_decoder": choice["sd_added"],
        "encoder_weight_grid": choice["grid"],
        "w": choice["w"],
        "score_weight": choice["encoder_weight"],
        "decoder_weight": choice["added_weight"],
        "val_tau_b": choice["val_tau_b"],
        "val_tau_b_per_model": choice["per_model"],
        "encoder_val_tau_b": mean_val_tau(encoder_val, splits)[0],
        "decoder_val_tau_b": chosen["val_tau_b"],
    }
    return DecoderPrior(decoder, head, cfg["batch_size"]), facts


def alpha_note(facts: dict) -> str:
    """' (alpha a)' for a ridge's chosen alpha; '' for a pairwise head (no alpha)."""
    return f" (alpha {facts['alpha']:g})" if facts.get("alpha") is not None else ""


def write_plot(facts: dict, name: str, out: Path, features: str = "tfidf") -> None:
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
    added = "TF-IDF + ridge" if features == "tfidf" else f"decoder {facts['decoder']['head']}"
    ax.set_xlabel(f"w: weight of the predictor (0 = {added} alone, 1 = predictor alone)")
    ax.set_ylabel("val Kendall tau_b")
    ax.set_title(
        f"blend of {name}: predictor + {added}{alpha_note(facts)}\nchosen on val: w = {facts['w']:g}",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_figure(fig, out, dpi=110)
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
    from pipeline.contracts import ensure_parent, predictor_dir, write_json
    from pipeline.ranking.checkpoint import (
        DECODER,
        LEXICAL,
        attach_decoder,
        attach_lexical,
        copy_checkpoint,
        read_meta,
        read_trained_on,
    )
    from pipeline.serving.scorer import Scorer

    t0 = time.perf_counter()
    method, features = check_params(model, params)  # a bad setting stops the stage before any scoring
    for out in (Path(metrics_dir) / f"{model}.json", Path(plots_dir) / f"{model}.png"):
        ensure_parent(out, create=False)  # an output in the way, found before the checkpoint is written
    src = predictor_dir(model, method, models_root)
    meta = read_meta(src)
    if features == "tfidf" and LEXICAL in meta:
        raise ValueError(f"blend: {src} already adds a lexical model to its score (a blend, or train's lexical_prior)")
    if DECODER in meta:
        raise ValueError(f"blend: {src} already adds a decoder prior to its score")
    trained_on = read_trained_on(src, meta)
    members = list(trained_on.get("members") or [trained_on.get("model") or model])
    splits = member_splits(members, data_root)
    decoder = load_decoder(params) if features == "decoder" else None  # a bad decoder fails before scoring

    print(f"blend: scoring the val prompts of {', '.join(members)} with {src}", flush=True)
    scorer = Scorer.from_pretrained(src)
    encoder_val = {m: scorer.score(splits[m]["val"]["prompt"].tolist(), progress=True).astype(float) for m in members}
    dst = predictor_dir(model, blended_method(method, features), models_root)
    probe = splits[members[0]]["val"]["prompt"].tolist()[:64]
    if features == "tfidf":
        print(
            f"blend: fitting TF-IDF + ridge on {sum(len(s['train']) for s in splits.values())} train prompts",
            flush=True,
        )
        added, facts = fit_blend(members, splits, encoder_val, params)
        attach, summary = attach_lexical, f"TF-IDF alone {facts['lexical_val_tau_b']:.3f}"
        weights = {"encoder_weight": facts["encoder_weight"], "lexical_weight": facts["lexical_weight"]}
    else:
        added, facts = fit_decoder_blend(members, splits, encoder_val, params, decoder=decoder)
        attach, summary = attach_decoder, f"decoder {facts['decoder']['head']} alone {facts['decoder_val_tau_b']:.3f}"
        weights = {"score_weight": facts["score_weight"], "decoder_weight": facts["decoder_weight"]}
    source_weight, added_weight = weights.values()
    expected = source_weight * encoder_val[members[0]][:64] + added_weight * added.predict(probe)

    def accept(copy: Path) -> None:
        """The regression attached and the stage's own acceptance test, on the copy before it replaces
        `dst`: an interruption or a failed check leaves the old `dst` (or none), never a half blend.
        The serving loader takes the copy and reproduces the val blend (a bfloat16 decoder's
        features move a little with their batch-mates: a few % of the spread)."""
        attach(
            copy,
            added,
            **weights,
            alpha=facts["alpha"],
            w=facts["w"],
            chosen_on="val split: mean over trained_on.members of val tau_b",
            val_tau_b=facts["val_tau_b"],
            encoder_val_tau_b=facts["encoder_val_tau_b"],
        )
        check = Scorer.from_pretrained(copy).score(probe)
        atol = 1e-3 if features == "tfidf" else 0.05 * float(np.std(expected))
        if not np.allclose(check, expected, rtol=1e-3, atol=atol):
            raise ValueError(
                f"blend: the blend of {src} does not score as the blend chosen on val; {dst} left as it was"
            )

    copy_checkpoint(src, dst, method=blended_method(method, features), accept=accept)  # weights copied, re-hashed

    facts = {"model": model, "method": method, "features": features, "checkpoint": str(dst), **facts}
    facts["stage_wall_s"] = round(time.perf_counter() - t0, 2)
    write_json(facts, Path(metrics_dir) / f"{model}.json")
    write_plot(facts, f"{model}/{method}", Path(plots_dir) / f"{model}.png", features)
    print(
        f"blend: {dst}: w={facts['w']:g}{alpha_note(facts)}; mean val tau_b {facts['val_tau_b']:.3f} "
        f"(predictor alone {facts['encoder_val_tau_b']:.3f}, {summary}); {facts['stage_wall_s']:.0f} s",
        flush=True,
    )
    return facts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pars blend", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a train model of params blend.predictors")
    ap.add_argument("--params", default=None, help=PARAMS_HELP)
    ap.add_argument("--data", default="data", help="data root (default: %(default)s)")
    ap.add_argument("--models", default="models", help="models root (reads and writes <root>/<model>/...)")
    ap.add_argument("--metrics", default="metrics/blend", help="where <model>.json goes (default: %(default)s)")
    ap.add_argument("--plots", default="plots/blend", help="where the figures go (default: %(default)s)")
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
