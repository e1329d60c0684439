"""evaluate: every trained predictor against every model's test-split answers.

For each predictor (train model X, method) and eval model Y, per dataset and overall:
Kendall tau_b of scores against mean answer lengths with a bootstrap 95% interval, pair accuracy
on delta-filtered test pairs, and paired bootstraps of the gains over the prompt-length baseline
and over the TF-IDF + ridge reference; for an eval model with cut answers (at max_tokens, by a filter or an abort), Harrell's C
too (pairs whose order the cut leaves known). References on the same prompts: the noise ceiling (tau_b
between two samples' lengths, models with k >= 2), the prompt-length baseline (tau_b of prompt
tokens, counted with the packaged MiniLM tokenizer by default, untruncated, no special tokens) and
TF-IDF + ridge (a bag-of-words regression of log answer length, fitted per eval model on its
train-split prompts, alpha chosen on its val split): the cheap learned model a fine-tuned ranker
has to beat to be worth its encoder. `method_differences` holds the paired bootstrap of
tau_b(pairwise) - tau_b(other method) for each train model, eval model and group.

Each distinct test prompt is scored once per predictor (the serving Scorer's checkpoints, cut to
tokens as serving cuts them) and reused for every eval model. Predictors fine-tuned from one
encoder share their frozen lower layers bit for bit: those run once per batch for all of them
(`score_together`), the same scores for a fraction of the work.

Writes metrics/ranking.json, metrics/transfer.json, data/scores/scores.parquet and
plots/evaluate/ (a DVC plot CSV and two PNGs), all only once every metric is computed; logs the
table to W&B (offline by default).
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.contracts import (
    GENERATION_COUNTS,
    PROMPTS,
    SCORES,
    ensure_parent,
    generations_path,
    predictor_dir,
    prompts_path,
    read_table,
    scores_path,
    write_figure,
    write_json,
    write_table,
    write_text,
)
from pipeline.encoders import PACKAGED_ENCODERS, resolve_encoder
from pipeline.errors import PARSError
from pipeline.hardware import resolve_device
from pipeline.params import PARAMS_HELP, Section, load_params
from pipeline.ranking import metrics as M
from pipeline.ranking.labels import check_generations, check_known_prompts, prompt_labels
from pipeline.ranking.predictors import evaluated_predictors, names
from pipeline.ranking.report_tables import OVERALL, ranking_rows, render_markdown
from pipeline.serving.scorer import PRECISIONS, resolve_precision
from pipeline.tracking import MODE_ALIASES, MODES, provenance, run_dir, run_group, start_run, wandb_mode

PAIRWISE = "pairwise"  # method_differences compares every other method against this one
# what write_plots writes: the only files of the plots directory it replaces (nothing else there is touched)
PLOT_FILES = ("tau_b.csv", "tau_b.png", "transfer.png")
# wandb.init's modes and its old names for offline and online (dryrun, run)
WANDB_MODES = (*MODES, *MODE_ALIASES)
# what a local tokenizer directory holds (fast, WordPiece, BPE, SentencePiece)
TOKENIZER_DIR_MARKERS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "tokenizer.model",
)


def prompt_token_counts(texts: list[str], tokenizer_name: str) -> np.ndarray:
    """Prompt length in tokens (no truncation, no special tokens): the trivial baseline's score."""
    from pipeline.ranking.model import load_tokenizer

    tok = load_tokenizer(tokenizer_name)
    ids = tok(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    return np.array([len(x) for x in ids], dtype=float)


def _section(value, where: str) -> Section:
    """`value` with Section's typed reads (run() is also called with plain dicts)."""
    return value if isinstance(value, Section) else Section(value, where)


def check_params(params, machine: bool = True) -> dict:
    """The evaluate section checked before anything loads (a bad value is one line naming its key):
    the settings run() uses. A negative batch_size once gave a wrong tau_b without a word.
    `machine=False` (`pars profile`): a hub tokenizer is not looked up."""
    sec = _section(params, "params: evaluate").only(
        ("train_models", "methods", "cross_models", "blends", "eval_models", "delta", "bootstrap", "batch_size")
        + ("precision", "device", "torch_threads", "baseline_tokenizer", "tfidf_ridge", "wandb")
    )
    for key in ("train_models", "methods", "eval_models", "cross_models", "blends"):
        if sec[key] is None and key not in ("cross_models", "blends"):  # names() would take it as none
            raise PARSError(f"{sec.where}.{key} None: must be a list of names")
        listed = names(sec, key)
        twice = sorted({n for n in listed if listed.count(n) > 1})
        if twice:  # one predictor twice breaks the score table's index after all the scoring
            raise PARSError(f"{sec.where}.{key}: {', '.join(twice)} named twice")
    if not sec["eval_models"]:
        raise PARSError(f"{sec.where}.eval_models []: no eval model, nothing to evaluate")
    from pipeline.ranking.losses import METHODS

    unknown = [m for m in names(sec, "methods") if m not in METHODS]
    if unknown:  # else reported later as checkpoints train never wrote
        raise PARSError(f"{sec.where}.methods: unknown method {unknown[0]!r} (known: {', '.join(METHODS)})")
    origin: dict = {}  # predictor -> the key naming it: cross_models or blends may repeat train_models'
    for key, keys in (("train_models", ("train_models", "methods")), ("cross_models", ()), ("blends", ())):
        for model, method in evaluated_predictors({k: sec[k] for k in keys or (key,)}):
            if (model, method) in origin:
                raise PARSError(
                    f"{sec.where}.{key}: {model}/{method} is already evaluated through {origin[model, method]}"
                )
            origin[model, method] = key
    if not origin:
        raise PARSError(
            f"{sec.where}.train_models {sec['train_models']!r} (with methods, cross_models, blends): "
            "no predictor, nothing to evaluate"
        )
    boot = _section(sec.mapping("bootstrap"), f"{sec.where}.bootstrap").only(("n", "seed", "level"))
    tfidf = _section(sec.mapping("tfidf_ridge"), f"{sec.where}.tfidf_ridge")
    keys = ("ngram_max", "min_df", "alphas", "min_train_prompts")
    missing_keys = sorted(set(keys) - set(tfidf.only(keys)))
    if missing_keys:  # params.yaml holds these defaults
        raise KeyError(f"{tfidf.where} lacks {', '.join(missing_keys)} (see the repository's params.yaml)")
    tfidf.integer("ngram_max", minimum=1)
    tfidf.integer("min_df", minimum=1)
    tfidf.integer("min_train_prompts", minimum=1)
    tfidf.numbers("alphas", positive=True)
    tokenizer = sec["baseline_tokenizer"]
    if not isinstance(tokenizer, str) or not tokenizer:
        raise PARSError(f"{sec.where}.baseline_tokenizer {tokenizer!r}: must be a tokenizer name")
    resolve_encoder(
        tokenizer, key=f"{sec.where}.baseline_tokenizer", lookup=machine
    )  # a mistyped name: one line naming the key
    local = Path(tokenizer).expanduser()
    if machine and tokenizer not in PACKAGED_ENCODERS and local.exists():
        # resolve_encoder takes any existing path; transformers' words for a wrong one name no key
        if not (local.is_dir() and any((local / name).is_file() for name in TOKENIZER_DIR_MARKERS)):
            raise PARSError(
                f"{sec.where}.baseline_tokenizer {tokenizer!r}: not a tokenizer directory "
                f"(it holds none of {', '.join(TOKENIZER_DIR_MARKERS)})"
            )
    wandb = _section(sec.mapping("wandb"), f"{sec.where}.wandb").only(("enabled", "project", "mode"))
    if not isinstance(wandb["enabled"], bool):
        raise PARSError(f"{wandb.where}.enabled {wandb['enabled']!r}: must be true or false")
    for key in ("project", "mode") if wandb["enabled"] else ():
        if key not in wandb:  # read at the very end: missing, it would fail after all the scoring
            raise PARSError(f"{wandb.where}.{key} is missing")
    if wandb["enabled"]:  # wandb.init refuses a bad mode only after every output is written
        wandb.choice("mode", WANDB_MODES)
        if machine and os.environ.get("WANDB_MODE", "disabled") not in WANDB_MODES:  # log_wandb prefers it
            raise PARSError(f"WANDB_MODE {os.environ['WANDB_MODE']!r}: must be one of {', '.join(WANDB_MODES)}")
    return {
        "batch_size": sec.integer("batch_size", minimum=1),
        "delta": sec.number("delta", positive=True, below=1),
        "n_boot": boot.integer("n", minimum=2),  # one resample is no interval
        "seed": boot.integer("seed", minimum=0),
        "level": boot.number("level", positive=True, below=1),
        "torch_threads": sec.integer("torch_threads", minimum=1, optional=True),
        "precision": sec.choice("precision", PRECISIONS),
        "device": _device_setting(sec, machine),
        "baseline_tokenizer": tokenizer,
        "tfidf_ridge": tfidf,
    }


def _device_setting(sec, machine: bool) -> str:
    """evaluate.device as this machine has it (`auto` resolved), or, for `pars profile` (`machine`
    False), only checked in form: the GPU is the machine's that runs the stage."""
    from pipeline.hardware import TORCH_DEVICES

    device = sec["device"]
    if not isinstance(device, str) or not re.fullmatch(f"auto|{TORCH_DEVICES}", device):
        raise PARSError(f"{sec.where}.device {device!r}: must be auto, cpu, cuda, cuda:N or mps")
    if not machine:
        return device
    try:  # a GPU this machine lacks: one line now, not a failure in torch after the references
        return resolve_device(device)
    except ValueError as exc:
        raise PARSError(f"{sec.where}.device {exc}") from None


def check_outputs(data_root: Path, models_root: Path, metrics_dir: Path, plots_dir: Path) -> None:
    """Every output path writable in shape (no file where a directory goes) before any scoring; and
    the plots directory not one holding the working directory or the stage's data (only its
    PLOT_FILES are replaced there, so it may sit inside a scratch run's root)."""
    for path in (scores_path(data_root), metrics_dir / "ranking.json", metrics_dir / "transfer.json"):
        ensure_parent(path, create=False)
    for name in PLOT_FILES:
        ensure_parent(plots_dir / name, create=False)
    plots = plots_dir.resolve()
    for other in (Path.cwd(), data_root, models_root, metrics_dir):
        if plots == other.resolve() or plots in other.resolve().parents:
            raise PARSError(f"plots directory {plots_dir} holds {other}; give the plots a directory of their own")


def score_predictors(
    test: pd.DataFrame,
    predictors: list[tuple[str, str]],
    models_root: Path,
    batch_size: int,
    precision: str = "32-true",
    device: str = "cpu",
) -> pd.DataFrame:
    """Scores of each predictor on each test prompt. The predictors' shared frozen lower layers
    run once per batch for all of them (`score_together`)."""
    from pipeline.serving.scorer import Scorer, score_together

    texts = test["prompt"].tolist()
    scorers = []
    for model, method in predictors:
        path = predictor_dir(model, method, models_root)
        scorers.append(Scorer.from_pretrained(path, device=device, batch_size=batch_size, precision=precision))
    if scorers:
        print(
            f"evaluate: scoring {len(texts)} test prompts with {len(scorers)} predictors ({scorers[0].precision}, {device})",
            flush=True,
        )
    frames = [
        pd.DataFrame(
            {
                "prompt_id": test["prompt_id"].to_numpy(),
                "dataset": test["dataset"].to_numpy(),
                "train_model": model,
                "method": method,
                "score": scores,
            }
        )
        for (model, method), scores in zip(predictors, score_together(scorers, texts, progress=True))
    ]
    if not frames:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in SCORES.names})
    return pd.concat(frames, ignore_index=True)


def _tau_block(
    scores: pd.Series, lab: pd.DataFrame, idx: np.ndarray, level: float, delta: float, censored: bool = False
) -> tuple[dict, np.ndarray]:
    """tau_b of `scores` against `lab`'s lengths with its bootstrap (over `idx`) and pair accuracy.
    `censored` (the eval model has cut answers: max_tokens, a filter or an abort): Harrell's C too, on the same resamples,
    since tau_b takes a cut length as exact."""
    s = scores.to_numpy(dtype=float)
    lengths = lab["length"].to_numpy()
    truncated = lab["truncated"].to_numpy()
    boot = M.bootstrap_taus(s, lengths, idx)
    low, high = M.percentile_ci(boot, level)
    acc, n_pairs = M.delta_pair_accuracy(s, lengths, truncated, delta=delta)
    block = {
        "kendall_tau_b": M.kendall_tau_b(s, lengths),
        "ci_low": low,
        "ci_high": high,
        "n_prompts": int(len(lab)),
        "pair_accuracy": acc,
        "n_pairs": n_pairs,
    }
    if censored:
        c, n_comparable = M.harrell_c(lengths, s, truncated)
        c_low, c_high = M.percentile_ci(M.bootstrap_harrell_c(lengths, s, truncated, idx), level)
        block.update(
            {"harrell_c": c, "harrell_c_ci_low": c_low, "harrell_c_ci_high": c_high, "n_comparable_pairs": n_comparable}
        )
    return block, boot


def tfidf_ridge_scores(
    train_texts,
    train_lengths,
    val_texts,
    val_lengths,
    test_texts,
    *,
    alphas,
    ngram_max: int,
    min_df: int,
    min_df_key: str = "min_df",
) -> tuple[np.ndarray, float, float]:
    """TF-IDF (lowercased word 1..ngram_max-grams, sublinear tf) + ridge on log1p(length): the
    bag-of-words reference. Returns (test scores, chosen alpha, its val tau_b).

    Vocabulary, IDF and ridge are fitted on the train texts only; alpha is the grid's best tau_b
    on val (the first of the grid on ties, and when val cannot rank: under two prompts or constant
    predictions, val tau_b then NaN). The train fit at that alpha is the one kept (no refit on
    train + val: val only chooses). Test texts are only transformed: their labels never come in.
    A min_df no term reaches is a ValueError naming `min_df_key` (the params key)."""
    from pipeline.ranking.lexical import TfidfRidge

    alphas = [float(a) for a in alphas]
    if not alphas:
        raise ValueError("tfidf_ridge_scores: empty alpha grid")
    fits = TfidfRidge.fit_grid(
        train_texts, train_lengths, alphas=alphas, ngram_max=ngram_max, min_df=min_df, min_df_key=min_df_key
    )
    val_texts = list(val_texts)
    best_fit, best_alpha, best_tau = None, alphas[0], float("nan")
    for alpha, fit in zip(alphas, fits):
        tau = M.kendall_tau_b(fit.predict(val_texts), val_lengths) if val_texts else float("nan")
        if best_fit is None or (not math.isnan(tau) and (math.isnan(best_tau) or tau > best_tau)):
            best_fit, best_alpha, best_tau = fit, alpha, tau
    return best_fit.predict(list(test_texts)), best_alpha, best_tau


def _tfidf_reference(
    prompts: pd.DataFrame, gens: pd.DataFrame, eval_model: str, test: pd.DataFrame, settings: dict
) -> tuple[pd.Series, dict] | None:
    """TF-IDF + ridge scores of every test prompt (indexed by prompt_id) and the fit's facts, for
    one eval model; None (with a printed line) when it has too few labelled train prompts."""
    fit_prompts = prompts[prompts["split"].isin(["train", "val"])].set_index("prompt_id")[["split", "prompt"]]
    answered = gens[gens["prompt_id"].isin(fit_prompts.index)]
    labels = (
        (
            prompt_labels(answered, where=f"generations of {eval_model}")
            .set_index("prompt_id")
            .join(fit_prompts, how="inner")
            .sort_index()
        )
        if len(answered)
        else fit_prompts.iloc[:0]
    )
    train = labels[labels["split"] == "train"]
    val = labels[labels["split"] == "val"]
    if len(train) < int(settings["min_train_prompts"]):
        print(
            f"evaluate: no TF-IDF + ridge reference for {eval_model}: {len(train)} labelled train prompts "
            f"(< min_train_prompts={settings['min_train_prompts']}); written as null",
            flush=True,
        )
        return None
    scores, alpha, val_tau = tfidf_ridge_scores(
        train["prompt"].tolist(),
        train["length"].to_numpy(),
        val["prompt"].tolist(),
        val["length"].to_numpy(),
        test["prompt"].tolist(),
        alphas=settings["alphas"],
        ngram_max=settings["ngram_max"],
        min_df=settings["min_df"],
        min_df_key=f"{getattr(settings, 'where', 'evaluate.tfidf_ridge')}.min_df",
    )
    print(
        f"evaluate: TF-IDF + ridge for {eval_model}: {len(train)} train prompts, alpha={alpha:g} "
        f"(val tau_b {val_tau:.3f} on {len(val)} prompts)",
        flush=True,
    )
    return pd.Series(scores, index=test.index), {
        "n_train_prompts": int(len(train)),
        "n_val_prompts": int(len(val)),
        "alpha": alpha,
        "val_kendall_tau_b": val_tau,
    }


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


def train_twins(prompts: pd.DataFrame) -> pd.Series:
    """Test-split prompt ids whose text is also a train or val prompt, of any dataset, compared
    lowercased with whitespace collapsed: AlpacaEval holds prompts taken from ShareGPT, and ShareGPT's
    short first turns ("continue", "5 more") recur as later turns of train conversations. A
    predictor (the cross-model one above all) has seen those texts with a length label, so they are
    left out of every tau_b figure (their scores are still written: the simulator replays them as traffic)."""
    text = prompts["prompt"].str.lower().str.split().str.join(" ")
    seen = set(text[prompts["split"].isin(["train", "val"])])
    return prompts.loc[(prompts["split"] == "test") & text.isin(seen), "prompt_id"]


def eval_prompts(prompts: pd.DataFrame) -> tuple[pd.Series, pd.DataFrame]:
    """(train twins, the test prompts tau_b is taken on: the test split without them, by prompt_id)."""
    twins = train_twins(prompts)
    return twins, prompts[prompts["split"] == "test"].set_index("prompt_id").drop(index=twins)


def check_eval_generations(
    prompts: pd.DataFrame, generations: dict[str, pd.DataFrame], where: dict[str, str] | None = None
) -> None:
    """Each eval model's generations as the pairs stage takes them (no null or unknown prompt_id, no
    negative tokens, ...) and answering some test prompt, else a ValueError naming `where[model]` (its
    file): a bad row would otherwise be dropped in silence, or fail after all the scoring."""
    twins, test = eval_prompts(prompts)
    for model, gens in generations.items():
        name = (where or {}).get(model, f"generations of {model}")
        check_generations(gens, name)
        check_known_prompts(gens["prompt_id"], prompts["prompt_id"], name)
        if not gens["prompt_id"].isin(test.index).any():
            raise ValueError(
                f"{name}: no answers to test-split prompts"
                + (f" (besides {len(twins)} left out as twins of train/val prompts)" if len(twins) else "")
            )


def tfidf_references(
    prompts: pd.DataFrame, generations: dict[str, pd.DataFrame], settings: dict, where: dict[str, str] | None = None
) -> dict:
    """eval model -> its TF-IDF + ridge reference (`_tfidf_reference`), from generations checked first
    (`check_eval_generations`, naming `where[model]`); the stage fits them before scoring, so bad
    answers or a bad tfidf_ridge setting fail before the slow work."""
    check_eval_generations(prompts, generations, where)
    test = eval_prompts(prompts)[1]
    return {m: _tfidf_reference(prompts, gens, m, test, settings) for m, gens in generations.items()}


def evaluate(
    prompts: pd.DataFrame,
    generations: dict[str, pd.DataFrame],
    scores: pd.DataFrame,
    prompt_tokens: pd.Series,
    *,
    delta: float,
    n_boot: int,
    seed: int,
    level: float,
    tfidf_ridge: dict,
    tfidf_refs: dict | None = None,
) -> dict:
    """All metrics from in-memory tables (no files, no neural models): the testable core of the stage.

    `generations` maps eval model -> its generations (all splits: train and val prompts feed the
    TF-IDF reference); `scores` has SCORES' columns; `prompt_tokens` is indexed by prompt_id;
    `tfidf_ridge` is params `evaluate.tfidf_ridge` (ngram_max, min_df, alphas, min_train_prompts);
    `tfidf_refs` the TF-IDF references already fitted (`tfidf_references`, which checks the
    generations), else fitted here. Returns the ranking.json structure."""
    if tfidf_refs is None:
        tfidf_refs = tfidf_references(prompts, generations, tfidf_ridge)
    twins, test = eval_prompts(prompts)
    predictors = list(dict.fromkeys(zip(scores["train_model"], scores["method"])))
    score_of = {key: grp.set_index("prompt_id")["score"] for key, grp in scores.groupby(["train_model", "method"])}

    references: dict = {}
    results: dict = {}
    boot_of: dict = {}  # (train model, method, eval model, group) -> bootstrap taus, for method differences
    for eval_model, gens in generations.items():
        labels = prompt_labels(gens[gens["prompt_id"].isin(test.index)], where=f"generations of {eval_model}")
        # not empty: check_eval_generations refused a model that answers no test prompt
        labels = labels.set_index("prompt_id").join(test["dataset"], how="inner").sort_index()
        groups = {OVERALL: labels}
        groups.update({ds: grp for ds, grp in labels.groupby("dataset", sort=True)})
        censored = bool(labels["truncated"].any())  # some answer cut: Harrell's C in every cell of this model
        samples = M.sample_length_matrix(gens, labels.index)
        # the same resamples for the baseline, the ceiling and every predictor: paired comparisons
        idx_of = {group: M.bootstrap_indices(len(lab), n_boot, seed) for group, lab in groups.items()}
        tfidf = tfidf_refs[eval_model]
        references[eval_model] = {}
        base_boot: dict[str, np.ndarray] = {}
        tfidf_boot: dict[str, np.ndarray] = {}
        for group, lab in groups.items():
            base, base_boot[group] = _tau_block(
                prompt_tokens.reindex(lab.index), lab, idx_of[group], level, delta, censored
            )
            rows = labels.index.get_indexer(lab.index)
            ceiling = M.noise_ceiling(samples[rows], n_boot=n_boot, seed=seed, level=level)
            tfidf_block = None
            if tfidf is not None:
                tfidf_block, tfidf_boot[group] = _tau_block(
                    tfidf[0].reindex(lab.index), lab, idx_of[group], level, delta, censored
                )
                tfidf_block.update(tfidf[1])
            references[eval_model][group] = {
                "n_prompts": int(len(lab)),
                "n_truncated": int(lab["truncated"].sum()),
                "mean_answer_tokens": float(lab["length"].mean()),
                "prompt_length": base,
                "noise_ceiling": _public(ceiling) if ceiling else None,
                "tfidf_ridge": tfidf_block,
            }
        for model, method in predictors:
            cell = results.setdefault(model, {}).setdefault(method, {}).setdefault(eval_model, {})
            for group, lab in groups.items():
                s = score_of[(model, method)].reindex(lab.index)
                if s.isna().any():
                    raise ValueError(f"evaluate: {model}/{method} has no score for some {eval_model} test prompts")
                if not np.isfinite(s.to_numpy(dtype=float)).all():  # inf - inf would void every bootstrap
                    raise ValueError(f"evaluate: {model}/{method} gives an infinite score to some {eval_model} prompts")
                stat, boot = _tau_block(s, lab, idx_of[group], level, delta, censored)
                gain_low, gain_high = M.percentile_ci(boot - base_boot[group], level)
                stat.update(
                    {
                        "gain_over_prompt_length": stat["kendall_tau_b"]
                        - references[eval_model][group]["prompt_length"]["kendall_tau_b"],
                        "gain_ci_low": gain_low,
                        "gain_ci_high": gain_high,
                        # "beats" only when the paired 95% interval of the gain lies above zero
                        "beats_prompt_length": bool(gain_low > 0),
                    }
                )
                tfidf_ref = references[eval_model][group]["tfidf_ridge"]
                if tfidf_ref is None:  # no reference for this eval model: no gain, and not "beaten"
                    stat.update(
                        {
                            "gain_over_tfidf_ridge": None,
                            "tfidf_gain_ci_low": None,
                            "tfidf_gain_ci_high": None,
                            "beats_tfidf_ridge": False,
                        }
                    )
                else:
                    t_low, t_high = M.percentile_ci(boot - tfidf_boot[group], level)
                    stat.update(
                        {
                            "gain_over_tfidf_ridge": stat["kendall_tau_b"] - tfidf_ref["kendall_tau_b"],
                            "tfidf_gain_ci_low": t_low,
                            "tfidf_gain_ci_high": t_high,
                            "beats_tfidf_ridge": bool(t_low > 0),
                        }
                    )
                cell[group] = stat
                boot_of[(model, method, eval_model, group)] = boot
    return {
        "settings": {
            "delta": delta,
            "bootstrap": {"n": n_boot, "seed": seed, "level": level},
            "length_label": "mean output_tokens over samples (reasoning included)",
            "split": "test",
            "excluded_test_prompts": {
                "rule": "the text (lowercased, whitespace collapsed) is also a train or val prompt of any dataset",
                "n_prompts": int(len(twins)),
                "by_dataset": {
                    str(k): int(v)
                    for k, v in prompts.set_index("prompt_id").loc[twins, "dataset"].value_counts().sort_index().items()
                },
            },
            "tfidf_ridge": {**tfidf_ridge, "fit_on": "train split", "alpha_chosen_on": "val split"},
        },
        "predictors": results,
        "references": references,
        "method_differences": method_differences(results, boot_of, level),
    }


def method_differences(results: dict, boot_of: dict, level: float) -> dict:
    """[train model][eval model][group][method] = tau_b(pairwise) - tau_b(method) with its paired
    bootstrap interval (same resamples), for every other method trained on the same model's answers."""
    out: dict = {}
    for model, by_method in results.items():
        if PAIRWISE not in by_method:
            continue
        for method, by_eval in by_method.items():
            if method == PAIRWISE:
                continue
            for eval_model, by_group in by_eval.items():
                for group, stat in by_group.items():
                    pairwise = results[model][PAIRWISE][eval_model][group]
                    low, high = M.percentile_ci(
                        boot_of[(model, PAIRWISE, eval_model, group)] - boot_of[(model, method, eval_model, group)],
                        level,
                    )
                    out.setdefault(model, {}).setdefault(eval_model, {}).setdefault(group, {})[method] = {
                        "diff": pairwise["kendall_tau_b"] - stat["kendall_tau_b"],
                        "ci_low": low,
                        "ci_high": high,
                    }
    return out


def transfer_matrix(ranking: dict, group: str = OVERALL) -> dict:
    """tau_b[method][train model][eval model] on `group`, from the ranking structure."""
    out: dict = {}
    for model, by_method in ranking["predictors"].items():
        for method, by_eval in by_method.items():
            for eval_model, by_group in by_eval.items():
                if group in by_group:
                    out.setdefault(method, {}).setdefault(model, {})[eval_model] = by_group[group]["kendall_tau_b"]
    return {
        "group": group,
        "kendall_tau_b": out,
        "train_models": list(ranking["predictors"]),
        "eval_models": list(ranking["references"]),
    }


def method_order(methods) -> list[str]:
    """The paper's pairwise first, then the other known methods, then any other name."""
    from pipeline.ranking.losses import METHODS

    present = set(methods)
    return [m for m in METHODS if m in present] + sorted(present - set(METHODS))


def write_plots(ranking: dict, transfer: dict, out_dir: Path) -> list[Path]:
    """tau_b by predictor and eval model (intervals, the references), the transfer heatmaps, and
    the DVC plot CSV: PLOT_FILES in `out_dir`, replaced (nothing else there is touched)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in PLOT_FILES:  # only these: a mistaken --plots must not cost anything else there
        (out_dir / name).unlink(missing_ok=True)
    rows = ranking_rows(ranking)
    overall = rows[rows["dataset"] == OVERALL]
    table = overall.assign(
        predictor=overall["train_model"] + "/" + overall["method"],
        cell=overall["eval_model"] + " | " + overall["train_model"] + "/" + overall["method"],
    ).to_csv(
        index=False,
        columns=["cell", "eval_model", "train_model", "method", "kendall_tau_b", "ci_low", "ci_high", "n_prompts"],
    )
    write_text(table, out_dir / "tau_b.csv")

    eval_models = list(ranking["references"])
    ncol = min(3, max(1, len(eval_models)))
    nrow = math.ceil(len(eval_models) / ncol) or 1
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.6 * nrow), squeeze=False, sharey=True)
    methods = method_order(overall["method"].unique())
    colors = dict(zip(methods, plt.cm.tab10.colors))
    for ax, eval_model in zip(axes.flat, eval_models):
        sub = overall[overall["eval_model"] == eval_model]
        sub = sub.sort_values(
            ["train_model", "method"], key=lambda c: c.map(methods.index) if c.name == "method" else c
        )
        # in-domain predictors (trained on this model's answers) first
        sub = pd.concat([sub[sub["train_model"] == eval_model], sub[sub["train_model"] != eval_model]])
        # one group of bars per training set (the colour says the method), a gap between groups
        group = (sub["train_model"] != sub["train_model"].shift()).cumsum().to_numpy() - 1
        x = np.arange(len(sub)) + 0.6 * group
        yerr = np.vstack([sub["kendall_tau_b"] - sub["ci_low"], sub["ci_high"] - sub["kendall_tau_b"]])
        ax.bar(
            x,
            sub["kendall_tau_b"],
            # a percentile interval need not hold its estimate (few resamples): no negative bar
            yerr=np.clip(np.nan_to_num(yerr), 0, None),
            capsize=3,
            color=[colors[m] for m in sub["method"]],
            edgecolor="black",
            linewidth=0.4,
        )
        groups = range(group.max() + 1) if len(group) else []
        ax.set_xticks(
            [x[group == g].mean() for g in groups],
            [sub["train_model"].iloc[np.argmax(group == g)] for g in groups],
            fontsize=8,
        )
        ax.set_xlabel("trained on", fontsize=8)
        ref = ranking["references"][eval_model][OVERALL]
        if ref["noise_ceiling"]:
            ax.axhline(ref["noise_ceiling"]["kendall_tau_b"], color="dimgray", ls="--", lw=1.2)
        ax.axhline(ref["prompt_length"]["kendall_tau_b"], color="tab:red", ls=":", lw=1.5)
        if ref.get("tfidf_ridge"):
            ax.axhline(ref["tfidf_ridge"]["kendall_tau_b"], color="tab:purple", ls="-.", lw=1.3)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title(f"{eval_model} (n={ref['n_prompts']})", fontsize=9)
    for ax in list(axes.flat)[len(eval_models) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("Kendall τ_b (test, 95% CI)")
    # one legend for every panel, below them: the methods' colours and the reference lines
    handles = [Patch(facecolor=colors[m], edgecolor="black", label=m) for m in methods] + [
        Line2D([], [], color="dimgray", ls="--", label="noise ceiling"),
        Line2D([], [], color="tab:red", ls=":", label="prompt length"),
        Line2D([], [], color="tab:purple", ls="-.", label="TF-IDF + ridge"),
    ]
    fig.suptitle("Predicted rank vs. true answer length, by eval model", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    write_figure(fig, out_dir / "tau_b.png", dpi=120)
    plt.close(fig)

    tm = transfer["kendall_tau_b"]
    methods = method_order(tm)
    if not methods:  # nothing to draw (no predictor results)
        return [out_dir / name for name in PLOT_FILES if (out_dir / name).exists()]
    width = (1.3 + 1.1 * len(eval_models)) * max(1, len(methods))
    fig, axes = plt.subplots(
        1, max(1, len(methods)), figsize=(width, 1.6 + 0.5 * len(transfer["train_models"])), squeeze=False
    )
    # a symmetric scale (0 is white, a negative tau_b blue) fitted to the values: on -1..1 the
    # 0.1-0.5 that predictors reach are all pale
    values = [
        abs(v) for m in methods for row in tm[m].values() for v in row.values() if v is not None and np.isfinite(v)
    ]
    limit = max(0.1, math.ceil(10 * max(values, default=0.1)) / 10)
    for ax, method in zip(axes[0], methods):
        train_models = transfer["train_models"]
        grid = np.array(
            [[tm[method].get(t, {}).get(e, np.nan) for e in eval_models] for t in train_models], dtype=float
        )
        im = ax.imshow(grid, vmin=-limit, vmax=limit, cmap="RdBu_r", aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            dark = not np.isnan(v) and abs(v) > 0.6 * limit  # white figures on the darkest cells
            text = "–" if np.isnan(v) else f"{v:.2f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
        ax.set_xticks(range(len(eval_models)), eval_models, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(train_models)), train_models, fontsize=8)
        ax.set_xlabel("evaluated on (answers of)", fontsize=8)
        ax.set_title(method, fontsize=9)
    axes[0][0].set_ylabel("trained on", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="Kendall τ_b")
    fig.suptitle("Cross-model transfer (test split, all datasets)", fontsize=10, y=1.04)
    write_figure(fig, out_dir / "transfer.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return [out_dir / name for name in PLOT_FILES]


def log_wandb(ranking: dict, params: dict) -> None:
    """The ranking table (and overall tau_b as summary) to a W&B run; offline unless told otherwise."""
    cfg = params["wandb"]
    if not cfg["enabled"]:
        return
    import wandb

    rows = ranking_rows(ranking)
    # grouped with train's runs, so the test figures sit beside the runs they score; mode: WANDB_MODE, else
    # evaluate.wandb.mode; dir given explicitly: wandb otherwise keeps the directory of an earlier run in this process
    run = start_run(
        wandb_mode(cfg["mode"]),
        project=cfg["project"],
        name="evaluate",
        group=run_group(),
        job_type="evaluate",
        dir=str(run_dir(os.environ.get("WANDB_DIR") or ".")),
        config={**{k: v for k, v in params.items() if k != "wandb"}, **provenance()},
    )
    try:
        run.log({"ranking": wandb.Table(dataframe=rows)})
        for r in rows[rows["dataset"] == OVERALL].itertuples():
            run.summary[f"tau_b/{r.train_model}/{r.method}/{r.eval_model}"] = r.kendall_tau_b
    finally:
        run.finish()


def lexical_prior_predictors(predictors, models_root) -> list[str]:
    """Names (<model>/<method>) of the predictors trained on top of a TF-IDF + ridge prior
    (train.lexical_prior), which their scores include: the report says so."""
    from pipeline.ranking.checkpoint import LEXICAL, read_meta

    return [
        f"{m}/{meth}"
        for m, meth in predictors
        if "trained_with" in (read_meta(predictor_dir(m, meth, models_root), verify_hash=False).get(LEXICAL) or {})
    ]


def run(
    params: dict,
    *,
    data_root: str | Path = "data",
    models_root: str | Path = "models",
    metrics_dir: str | Path = "metrics",
    plots_dir: str | Path = "plots/evaluate",
) -> dict:
    data_root, models_root = Path(data_root), Path(models_root)
    metrics_dir, plots_dir = Path(metrics_dir), Path(plots_dir)
    settings = check_params(params)  # all of the section, before any slow work
    check_outputs(data_root, models_root, metrics_dir, plots_dir)
    predictors = evaluated_predictors(params)
    missing = [
        str(predictor_dir(m, meth, models_root))
        for m, meth in predictors
        if not predictor_dir(m, meth, models_root).is_dir()
    ]
    if missing:  # fail before any slow work, naming every one
        raise FileNotFoundError(f"predictor checkpoint(s) missing: {', '.join(missing)} (has train run for them?)")
    tfidf, tokenizer, precision = settings["tfidf_ridge"], settings["baseline_tokenizer"], settings["precision"]
    prompts = read_table(prompts_path(data_root), PROMPTS)
    generations = {m: read_table(generations_path(m, data_root), GENERATION_COUNTS) for m in params["eval_models"]}
    test = prompts[prompts["split"] == "test"].sort_values("prompt_id").reset_index(drop=True)
    if test.empty:
        raise ValueError(f"{prompts_path(data_root)} has no test-split prompts")
    # every input checked, and the TF-IDF references fitted, before the slow scoring
    tfidf_refs = tfidf_references(
        prompts, generations, tfidf, {m: str(generations_path(m, data_root)) for m in generations}
    )

    if settings["torch_threads"]:  # on a CPU shared with other jobs, fewer threads can be faster
        import torch

        torch.set_num_threads(settings["torch_threads"])
    # the baseline's tokenizer (a hub one may be missing offline) before the slow scoring
    ptoks = pd.Series(prompt_token_counts(test["prompt"].tolist(), tokenizer), index=test["prompt_id"].to_numpy())
    scores = score_predictors(test, predictors, models_root, settings["batch_size"], precision, settings["device"])
    ranking = evaluate(
        prompts,
        generations,
        scores,
        ptoks,
        delta=settings["delta"],
        n_boot=settings["n_boot"],
        seed=settings["seed"],
        level=settings["level"],
        tfidf_ridge=tfidf,
        tfidf_refs=tfidf_refs,
    )
    ranking["settings"]["baseline_tokenizer"] = tokenizer
    ranking["settings"]["device"] = settings["device"]  # resolved by check_params
    ranking["settings"]["precision"] = resolve_precision(precision, settings["device"])
    ranking["settings"]["lexical_prior"] = lexical_prior_predictors(predictors, models_root)
    transfer = transfer_matrix(ranking)
    write_table(scores, scores_path(data_root), SCORES)  # outputs only once every metric is computed
    write_json(_no_nan(ranking), metrics_dir / "ranking.json")
    write_json(_no_nan(transfer), metrics_dir / "transfer.json")
    write_plots(ranking, transfer, plots_dir)
    log_wandb(ranking, params)
    return ranking


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("--no-wandb", action="store_true", help="do not log to W&B")
    # the stage uses the defaults; the options run it elsewhere (an experiment, a scratch copy)
    parser.add_argument("--params", default=None, help=PARAMS_HELP)
    parser.add_argument("--data", default="data", help="data root (prompts, generations; writes scores/)")
    parser.add_argument("--models", default="models", help="models root (<root>/<model>/<method>/)")
    parser.add_argument("--metrics", default="metrics", help="writes ranking.json, transfer.json here")
    parser.add_argument(
        "--plots", default="plots/evaluate", help=f"plots directory (its {', '.join(PLOT_FILES)} are replaced)"
    )
    args = parser.parse_args(argv)
    params = load_params("evaluate", args.params)
    if args.no_wandb:
        wandb = params.get("wandb")
        params["wandb"] = {**(wandb if isinstance(wandb, dict) else {}), "enabled": False}
    ranking = run(params, data_root=args.data, models_root=args.models, metrics_dir=args.metrics, plots_dir=args.plots)

    print(render_markdown(ranking))
    return 0
