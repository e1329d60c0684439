"""evaluate: every trained predictor against every model's test-split answers.

For each predictor (train model X, method) and eval model Y, per dataset and overall:
Kendall tau_b of scores against mean answer lengths with a bootstrap 95% interval, pair accuracy
on delta-filtered test pairs, and a paired bootstrap of the gain over the prompt-length baseline.
References on the same prompts: the noise ceiling (tau_b between two samples' lengths, models with
k >= 2) and the prompt-length baseline (tau_b of prompt tokens, counted with the packaged MiniLM
tokenizer by default, untruncated, no special tokens).

Each distinct test prompt is scored once per predictor (through the serving Scorer, so what is
evaluated is exactly what serving loads) and reused for every eval model.

Writes metrics/ranking.json, metrics/transfer.json, data/scores/scores.parquet and
plots/evaluate/ (a DVC plot CSV and two PNGs); logs the table to W&B (offline by default).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.contracts import GENERATIONS, PROMPTS, generations_path, prompts_path, read_table, write_json, write_table
from pipeline.pairs import prompt_labels
from pipeline.params import load_params
from pipeline.ranking import metrics as M
from pipeline.report import OVERALL, ranking_rows

# Scores of every predictor on every test prompt (read by the simulator and the engine benchmark).
SCORES = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("dataset", pa.string()),
        ("train_model", pa.string()),
        ("method", pa.string()),
        ("score", pa.float32()),  # higher = longer answer predicted
    ]
)


def scores_path(root: str | Path = "data") -> Path:
    return Path(root) / "scores" / "scores.parquet"


def predictor_dir(model: str, method: str, root: str | Path = "models") -> Path:
    return Path(root) / model / method


def prompt_token_counts(texts: list[str], tokenizer_name: str) -> np.ndarray:
    """Prompt length in tokens (no truncation, no special tokens): the trivial baseline's score."""
    from pipeline.ranking.model import load_tokenizer

    tok = load_tokenizer(tokenizer_name)
    ids = tok(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    return np.array([len(x) for x in ids], dtype=float)


def score_predictors(test: pd.DataFrame, predictors: list[tuple[str, str]], models_root: Path,
                     batch_size: int) -> pd.DataFrame:
    """Scores of each predictor on each test prompt, one Scorer pass per predictor."""
    from pipeline.serving.scorer import Scorer

    frames = []
    texts = test["prompt"].tolist()
    for model, method in predictors:
        path = predictor_dir(model, method, models_root)
        print(f"evaluate: scoring {len(texts)} test prompts with {path}", flush=True)
        scorer = Scorer.from_pretrained(path, batch_size=batch_size)
        frames.append(pd.DataFrame({"prompt_id": test["prompt_id"].to_numpy(), "dataset": test["dataset"].to_numpy(),
                                    "train_model": model, "method": method,
                                    "score": scorer.score(texts, progress=True)}))
    if not frames:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in SCORES.names})
    return pd.concat(frames, ignore_index=True)


def _tau_block(scores: pd.Series, lab: pd.DataFrame, idx: np.ndarray, level: float,
               delta: float) -> tuple[dict, np.ndarray]:
    """tau_b of `scores` against `lab`'s lengths with its bootstrap (over `idx`) and pair accuracy."""
    s = scores.to_numpy(dtype=float)
    lengths = lab["length"].to_numpy()
    boot = M.bootstrap_taus(s, lengths, idx)
    low, high = M.percentile_ci(boot, level)
    acc, n_pairs = M.pair_accuracy(s, lengths, lab["truncated"].to_numpy(), delta=delta)
    return {"kendall_tau_b": M.kendall_tau_b(s, lengths), "ci_low": low, "ci_high": high,
            "n_prompts": int(len(lab)), "pair_accuracy": acc, "n_pairs": n_pairs}, boot


def _no_nan(obj):
    """NaN (e.g. tau_b of a constant group) -> null: JSON has no NaN, and DVC/W&B parsers differ on it."""
    if isinstance(obj, dict):
        return {k: _no_nan(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_no_nan(v) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj


def _public(stat: dict) -> dict:
    return {k: v for k, v in stat.items() if not k.startswith("_")}


def evaluate(prompts: pd.DataFrame, generations: dict[str, pd.DataFrame], scores: pd.DataFrame,
             prompt_tokens: pd.Series, *, delta: float, n_boot: int, seed: int, level: float) -> dict:
    """All metrics from in-memory tables (no I/O, no models): the testable core of the stage.

    `generations` maps eval model -> its generations; `scores` has SCORES' columns;
    `prompt_tokens` is indexed by prompt_id. Returns the ranking.json structure."""
    test = prompts[prompts["split"] == "test"].set_index("prompt_id")
    predictors = list(dict.fromkeys(zip(scores["train_model"], scores["method"])))
    score_of = {key: grp.set_index("prompt_id")["score"] for key, grp in scores.groupby(["train_model", "method"])}

    references: dict = {}
    results: dict = {}
    for eval_model, gens in generations.items():
        labels = prompt_labels(gens[gens["prompt_id"].isin(test.index)], where=f"generations of {eval_model}")
        labels = labels.set_index("prompt_id").join(test["dataset"], how="inner").sort_index()
        if labels.empty:
            raise ValueError(f"evaluate: {eval_model} has no answers to test-split prompts")
        groups = {OVERALL: labels}
        groups.update({ds: grp for ds, grp in labels.groupby("dataset", sort=True)})
        samples = M.sample_length_matrix(gens, labels.index)
        # the same resamples for the baseline, the ceiling and every predictor: paired comparisons
        idx_of = {group: M.bootstrap_indices(len(lab), n_boot, seed) for group, lab in groups.items()}
        references[eval_model] = {}
        base_boot: dict[str, np.ndarray] = {}
        for group, lab in groups.items():
            base, base_boot[group] = _tau_block(prompt_tokens.reindex(lab.index), lab, idx_of[group], level, delta)
            rows = labels.index.get_indexer(lab.index)
            ceiling = M.noise_ceiling(samples[rows], n_boot=n_boot, seed=seed, level=level)
            references[eval_model][group] = {
                "n_prompts": int(len(lab)),
                "n_truncated": int(lab["truncated"].sum()),
                "mean_answer_tokens": float(lab["length"].mean()),
                "prompt_length": base,
                "noise_ceiling": _public(ceiling) if ceiling else None,
            }
        for model, method in predictors:
            cell = results.setdefault(model, {}).setdefault(method, {}).setdefault(eval_model, {})
            for group, lab in groups.items():
                s = score_of[(model, method)].reindex(lab.index)
                if s.isna().any():
                    raise ValueError(f"evaluate: {model}/{method} has no score for some {eval_model} test prompts")
                stat, boot = _tau_block(s, lab, idx_of[group], level, delta)
                gain_low, gain_high = M.percentile_ci(boot - base_boot[group], level)
                stat.update({
                    "gain_over_prompt_length": stat["kendall_tau_b"] - references[eval_model][group]["prompt_length"]["kendall_tau_b"],
                    "gain_ci_low": gain_low, "gain_ci_high": gain_high,
                    # "beats" only when the paired 95% interval of the gain lies above zero
                    "beats_prompt_length": bool(gain_low > 0),
                })
                cell[group] = stat
    return {
        "settings": {"delta": delta, "bootstrap": {"n": n_boot, "seed": seed, "level": level},
                     "length_label": "mean output_tokens over samples (reasoning included)",
                     "split": "test"},
        "predictors": results,
        "references": references,
    }


def transfer_matrix(ranking: dict, group: str = OVERALL) -> dict:
    """tau_b[method][train model][eval model] on `group`, from the ranking structure."""
    out: dict = {}
    for model, by_method in ranking["predictors"].items():
        for method, by_eval in by_method.items():
            for eval_model, by_group in by_eval.items():
                if group in by_group:
                    out.setdefault(method, {}).setdefault(model, {})[eval_model] = by_group[group]["kendall_tau_b"]
    return {"group": group, "kendall_tau_b": out,
            "train_models": list(ranking["predictors"]), "eval_models": list(ranking["references"])}


def write_plots(ranking: dict, transfer: dict, out_dir: Path) -> list[Path]:
    """tau_b by predictor and eval model (intervals, both references), the transfer heatmaps, and
    the DVC plot CSV. The directory is rewritten whole."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = ranking_rows(ranking)
    overall = rows[rows["dataset"] == OVERALL]
    overall.assign(predictor=overall["train_model"] + "/" + overall["method"],
                   cell=overall["eval_model"] + " | " + overall["train_model"] + "/" + overall["method"]).to_csv(
        out_dir / "tau_b.csv", index=False,
        columns=["cell", "eval_model", "train_model", "method", "kendall_tau_b", "ci_low", "ci_high", "n_prompts"])

    eval_models = list(ranking["references"])
    ncol = min(3, max(1, len(eval_models)))
    nrow = math.ceil(len(eval_models) / ncol) or 1
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.6 * nrow), squeeze=False, sharey=True)
    methods = sorted(overall["method"].unique())
    colors = dict(zip(methods, plt.cm.tab10.colors))
    for ax, eval_model in zip(axes.flat, eval_models):
        sub = overall[overall["eval_model"] == eval_model].sort_values(["train_model", "method"])
        # in-domain predictors (trained on this model's answers) first
        sub = pd.concat([sub[sub["train_model"] == eval_model], sub[sub["train_model"] != eval_model]])
        x = np.arange(len(sub))
        yerr = np.vstack([sub["kendall_tau_b"] - sub["ci_low"], sub["ci_high"] - sub["kendall_tau_b"]])
        ax.bar(x, sub["kendall_tau_b"], yerr=np.nan_to_num(yerr), capsize=3,
               color=[colors[m] for m in sub["method"]], edgecolor="black", linewidth=0.4)
        ax.set_xticks(x, [f"{m}\n({t})" for t, m in zip(sub["train_model"], sub["method"])], fontsize=7, rotation=30)
        ref = ranking["references"][eval_model][OVERALL]
        if ref["noise_ceiling"]:
            ax.axhline(ref["noise_ceiling"]["kendall_tau_b"], color="tab:green", ls="--", lw=1.2, label="noise ceiling")
        ax.axhline(ref["prompt_length"]["kendall_tau_b"], color="tab:red", ls=":", lw=1.5, label="prompt length")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title(f"{eval_model} (n={ref['n_prompts']})", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(eval_models):]:
        ax.axis("off")
    axes[0][0].set_ylabel("Kendall τ_b (test, 95% CI)")
    fig.suptitle("Predicted rank vs. true answer length, by eval model (x: method (trained on))", fontsize=10)
    fig.tight_layout()
    fig.savefig(out_dir / "tau_b.png", dpi=120)
    plt.close(fig)

    tm = transfer["kendall_tau_b"]
    methods = sorted(tm)
    if not methods:  # nothing to draw (no predictor results)
        return sorted(out_dir.iterdir())
    width = (1.3 + 1.1 * len(eval_models)) * max(1, len(methods))
    fig, axes = plt.subplots(1, max(1, len(methods)), figsize=(width, 1.6 + 0.5 * len(transfer["train_models"])),
                             squeeze=False)
    for ax, method in zip(axes[0], methods):
        train_models = transfer["train_models"]
        grid = np.array([[tm[method].get(t, {}).get(e, np.nan) for e in eval_models] for t in train_models], dtype=float)
        im = ax.imshow(grid, vmin=-1, vmax=1, cmap="RdBu_r", aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, "–" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(eval_models)), eval_models, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(train_models)), train_models, fontsize=8)
        ax.set_xlabel("evaluated on (answers of)", fontsize=8)
        ax.set_title(method, fontsize=9)
    axes[0][0].set_ylabel("trained on", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="Kendall τ_b")
    fig.suptitle("Cross-model transfer (test split, all datasets)", fontsize=10, y=1.04)
    fig.savefig(out_dir / "transfer.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return sorted(out_dir.iterdir())


def log_wandb(ranking: dict, params: dict) -> None:
    """The ranking table (and overall tau_b as summary) to a W&B run; offline unless told otherwise."""
    cfg = params.get("wandb") or {}
    if not cfg.get("enabled", True):
        return
    import wandb

    rows = ranking_rows(ranking)
    mode = os.environ.get("WANDB_MODE", cfg.get("mode", "offline"))
    run = wandb.init(project=cfg.get("project", "pars"), job_type="evaluate", mode=mode,
                     config={k: v for k, v in params.items() if k != "wandb"})
    try:
        run.log({"ranking": wandb.Table(dataframe=rows)})
        for r in rows[rows["dataset"] == OVERALL].itertuples():
            run.summary[f"tau_b/{r.train_model}/{r.method}/{r.eval_model}"] = r.kendall_tau_b
    finally:
        run.finish()


def run(params: dict, *, data_root: str | Path = "data", models_root: str | Path = "models",
        metrics_dir: str | Path = "metrics", plots_dir: str | Path = "plots/evaluate") -> dict:
    data_root, models_root, metrics_dir = Path(data_root), Path(models_root), Path(metrics_dir)
    predictors = [(m, meth) for m in params["train_models"] for meth in params["methods"]]
    missing = [str(predictor_dir(m, meth, models_root)) for m, meth in predictors
               if not predictor_dir(m, meth, models_root).is_dir()]
    if missing:  # fail before any slow work, naming every one
        raise FileNotFoundError(f"predictor checkpoint(s) missing: {', '.join(missing)} (has train run for them?)")
    prompts = read_table(prompts_path(data_root), PROMPTS)
    generations = {m: read_table(generations_path(m, data_root), GENERATIONS) for m in params["eval_models"]}
    test = prompts[prompts["split"] == "test"].sort_values("prompt_id").reset_index(drop=True)
    if test.empty:
        raise ValueError(f"{prompts_path(data_root)} has no test-split prompts")

    if params.get("torch_threads"):  # on a CPU shared with other jobs, fewer threads can be faster
        import torch

        torch.set_num_threads(int(params["torch_threads"]))
    scores = score_predictors(test, predictors, models_root, int(params.get("batch_size", 32)))
    write_table(scores, scores_path(data_root), SCORES)
    ptoks = pd.Series(prompt_token_counts(test["prompt"].tolist(), params.get("baseline_tokenizer", "minilm-l6")),
                      index=test["prompt_id"].to_numpy())
    boot = params.get("bootstrap") or {}
    ranking = evaluate(prompts, generations, scores, ptoks, delta=float(params.get("delta", 0.2)),
                       n_boot=int(boot.get("n", 1000)), seed=int(boot.get("seed", 42)),
                       level=float(boot.get("level", 0.95)))
    ranking["settings"]["baseline_tokenizer"] = params.get("baseline_tokenizer", "minilm-l6")
    transfer = transfer_matrix(ranking)
    write_json(_no_nan(ranking), metrics_dir / "ranking.json")
    write_json(_no_nan(transfer), metrics_dir / "transfer.json")
    write_plots(ranking, transfer, Path(plots_dir))
    log_wandb(ranking, params)
    return ranking


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("--no-wandb", action="store_true", help="do not log to W&B")
    # the stage uses the defaults; the options run it elsewhere (an experiment, a scratch copy)
    parser.add_argument("--params", default=None, help="params file (default params.yaml)")
    parser.add_argument("--data", default="data", help="data root (prompts, generations; writes scores/)")
    parser.add_argument("--models", default="models", help="models root (<root>/<model>/<method>/)")
    parser.add_argument("--metrics", default="metrics", help="writes ranking.json, transfer.json here")
    parser.add_argument("--plots", default="plots/evaluate", help="plots directory (rewritten whole)")
    args = parser.parse_args(argv)
    params = load_params("evaluate", args.params)
    if args.no_wandb:
        params["wandb"] = {**(params.get("wandb") or {}), "enabled": False}
    ranking = run(params, data_root=args.data, models_root=args.models, metrics_dir=args.metrics,
                  plots_dir=args.plots)
    from pipeline.report import render_markdown

    print(render_markdown(ranking))
    return 0
