"""The paper-style tables of metrics/ranking.json as markdown (used by the report and evaluate stages).

Rows are methods (plus the references), columns dataset × eval model. A cell uses the
predictor trained on that column's model when there is one (in-domain, as in the paper), else the
first trained model's predictor, marked † (a transfer). A cross-model predictor (trained on several
models' answers, its `members`) has a row of its own: in-domain on its members, † elsewhere. A
predictor whose paired-bootstrap gain over the prompt-length baseline is not clearly above zero is
marked ✗, over the TF-IDF + ridge reference ‡. Intervals are written [low, high], 3 decimals.
An eval model with cut answers (max_tokens, a content filter, an abort) also gets a table of Harrell's C.
Then the cross-model transfer tables (in-domain cells in bold) and pairwise minus each other method
(paired bootstrap).
"""

from __future__ import annotations

import math

import pandas as pd

OVERALL = "overall"
METHOD_NAMES = {
    "pairwise": "pairwise (PARS)",
    "pointwise": "pointwise",
    "listwise": "listwise",
    "pairwise+tfidf": "pairwise + TF-IDF blend",
}


def ranking_rows(ranking: dict) -> pd.DataFrame:
    """ranking.json's predictor results as one flat row per (train model, method, eval model, dataset)."""
    rows = [
        {"train_model": model, "method": method, "eval_model": eval_model, "dataset": group, **stat}
        for model, by_method in ranking["predictors"].items()
        for method, by_eval in by_method.items()
        for eval_model, by_group in by_eval.items()
        for group, stat in by_group.items()
    ]
    columns = [
        "train_model",
        "method",
        "eval_model",
        "dataset",
        "kendall_tau_b",
        "ci_low",
        "ci_high",
        "n_prompts",
        "pair_accuracy",
        "n_pairs",
        "gain_over_prompt_length",
        "gain_ci_low",
        "gain_ci_high",
        "beats_prompt_length",
        "gain_over_tfidf_ridge",
        "tfidf_gain_ci_low",
        "tfidf_gain_ci_high",
        "beats_tfidf_ridge",
    ]
    return pd.DataFrame(rows, columns=columns)


def _fmt(x, ci=None) -> str:
    """A statistic with 3 decimals, and its interval as [low, high] when it has one."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    text = f"{x:.3f}"
    if ci and not any(v is None or math.isnan(v) for v in ci):
        text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return text


def _columns(ranking: dict) -> list[tuple[str, str]]:
    """(eval model, group) columns: each model's datasets, then its overall when it has several."""
    cols = []
    for eval_model, by_group in ranking["references"].items():
        datasets = [g for g in by_group if g != OVERALL]
        cols += [(eval_model, g) for g in datasets]
        if len(datasets) != 1:
            cols.append((eval_model, OVERALL))
    return cols


def _cell(stat: dict | None, refs: dict, transferred: bool = False) -> str:
    """One predictor's τ_b with its interval and marks: † transferred, ✗ not above prompt length,
    ‡ not above TF-IDF + ridge (when that reference exists)."""
    if stat is None:
        return "–"
    marks = ["†"] if transferred else []
    if not stat["beats_prompt_length"]:
        marks.append("✗")
    if refs.get("tfidf_ridge") and not stat.get("beats_tfidf_ridge"):
        marks.append("‡")
    return " ".join([_fmt(stat["kendall_tau_b"], (stat["ci_low"], stat["ci_high"])), *marks])


def _harrell_c(stat: dict | None) -> str:
    """Harrell's C with its interval, where evaluate wrote it (an eval model with cut answers)."""
    if not stat or "harrell_c" not in stat:
        return "–"
    return _fmt(stat["harrell_c"], (stat["harrell_c_ci_low"], stat["harrell_c_ci_high"]))


def join_names(items: list) -> str:
    """chatgpt, gpt-4-turbo and o3-mini"""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _image(plots: dict[str, str] | None, key: str, alt: str) -> list[str]:
    """A markdown image line for plots[key] (a link relative to the page), when the caller has one."""
    return ["", f"![{alt}]({plots[key]})"] if plots and plots.get(key) else []


def render_markdown(
    ranking: dict,
    estimated_ceilings: list[dict] | None = None,
    *,
    cross_members: dict[str, list[str] | None] | None = None,
    served: dict | None = None,
    plots: dict[str, str] | None = None,
) -> str:
    """The tau_b tables. `estimated_ceilings`: noise ceilings measured outside evaluate for a model
    with one sample per prompt (benchmarks/chatgpt_noise_ceiling.py), each with `model`, `dataset`,
    `noise_ceiling`, `what` and `command`; shown, marked §, where evaluate has none.
    `cross_members`: each cross-model predictor's member models (None: not recorded), from its
    training metrics; its cells on other models are marked † (a transfer). `served`: the serving
    checkpoint (`model`, `method`, `checkpoint`, `source`: the metrics file that says so), named in
    its row's note. `plots`: image links (`tau_b`, `transfer`) relative to the page."""
    estimated = {(e["model"], e["dataset"]): e for e in estimated_ceilings or []}
    cols = _columns(ranking)
    train_models = list(ranking["predictors"])
    methods = list(dict.fromkeys(m for by_method in ranking["predictors"].values() for m in by_method))
    header = "| method | " + " | ".join(f"{g} · {m}" for m, g in cols) + " |"
    lines = [
        "## Kendall τ_b of predicted rank vs. true answer length (test split, 95% bootstrap CI)",
        "",
        "Source: `metrics/ranking.json` (`dvc repro evaluate`). Each cell: τ_b [95% bootstrap interval], then "
        "its marks, explained below the table.",
        "",
        header,
        "|" + "---|" * (len(cols) + 1),
    ]
    per_model = [m for m in train_models if m in ranking["references"]]  # the others are cross-model
    cross = [m for m in train_models if m not in per_model]
    members = {m: (cross_members or {}).get(m) for m in cross}
    transferred = False
    for method in methods:
        cells = []
        for eval_model, group in cols:
            source = eval_model if eval_model in per_model else (per_model[0] if per_model else None)
            stat = (
                ranking["predictors"].get(source, {}).get(method, {}).get(eval_model, {}).get(group) if source else None
            )
            transferred |= stat is not None and source != eval_model
            cells.append(_cell(stat, ranking["references"][eval_model][group], transferred=source != eval_model))
        lines.append(f"| {METHOD_NAMES.get(method, method)} | " + " | ".join(cells) + " |")
    # cross-model predictors (trained on several models' answers, so no eval model of their own):
    # in-domain on their members, a transfer (†) on any other model
    cross_transfer = False
    for model in cross:
        for method, by_eval in ranking["predictors"][model].items():
            cells = []
            for eval_model, group in cols:
                stat = by_eval.get(eval_model, {}).get(group)
                away = members[model] is not None and eval_model not in members[model]
                cross_transfer |= stat is not None and away
                cells.append(_cell(stat, ranking["references"][eval_model][group], transferred=away))
            lines.append(f"| cross-model {METHOD_NAMES.get(method, method)}: `{model}` | " + " | ".join(cells) + " |")
    has_tfidf = any(ranking["references"][m][g].get("tfidf_ridge") for m, g in cols)
    refs = [
        ("noise_ceiling", "noise ceiling (sample vs sample)", "n/a (k=1)"),
        ("prompt_length", "prompt length (tokens)", "–"),
    ]
    if any("tfidf_ridge" in ranking["references"][m][g] for m, g in cols):  # absent from older ranking.json
        refs.append(("tfidf_ridge", "TF-IDF + ridge (train split)", "n/a (few train prompts)"))
    estimated_shown = []
    for ref, label, missing in refs:
        cells = []
        for eval_model, group in cols:
            stat = ranking["references"][eval_model][group].get(ref)
            mark = ""
            if stat is None and ref == "noise_ceiling" and (eval_model, group) in estimated:
                stat, mark = estimated[(eval_model, group)]["noise_ceiling"], " §"
                estimated_shown.append(estimated[(eval_model, group)])
            cells.append(_fmt(stat["kendall_tau_b"], (stat["ci_low"], stat["ci_high"])) + mark if stat else missing)
        lines.append(f"| *{label}* | " + " | ".join(cells) + " |")
    lines.append(
        "| *test prompts* | " + " | ".join(str(ranking["references"][m][g]["n_prompts"]) for m, g in cols) + " |"
    )
    cut = [ranking["references"][m][g].get("n_truncated") for m, g in cols]
    if any(cut):
        lines.append("| *of which cut ¶* | " + " | ".join("–" if n is None else str(n) for n in cut) + " |")
    lines.append("")
    notes = [
        "✗: does not beat the prompt-length baseline (paired bootstrap 95% CI of the gain includes 0 or lies below it)."
    ]
    if any(cut):
        notes.append(
            "¶: prompts with at least one answer cut (at max_tokens, by a content filter or an abort): their label (the mean "
            "of the samples) is a lower bound (pairs keep such a prompt only as the longer member)."
        )
    if has_tfidf:
        ngram_max = (ranking.get("settings", {}).get("tfidf_ridge") or {}).get("ngram_max", "?")
        notes.append(
            "‡: does not beat the TF-IDF + ridge reference (paired bootstrap 95% CI of the gain includes 0 "
            "or lies below it); "
            f"TF-IDF of word 1–{ngram_max}-grams + ridge on log answer length, fitted on the eval model's "
            "train-split prompts, alpha chosen on its val split."
        )
    if transferred or cross_transfer:
        why = []
        if transferred:
            why.append(
                f"in a method row, no predictor was trained on this model's answers alone and the {per_model[0]} "
                "predictor is shown"
            )
        if cross_transfer:
            why.append("in a cross-model row, the model is not one of the predictor's members")
        notes.append(
            "†: a transfer, scored on a model whose answers the predictor never trained on: " + "; ".join(why) + "."
        )
    if cross_members is not None:  # the caller looked the members up: say what each cross-model row is
        notes += [_cross_note(model, members[model], list(ranking["references"]), served) for model in cross]
    notes.append(
        "Noise ceiling: τ_b between two independent samples' lengths, averaged over sample pairs; "
        "predictors are scored against the mean of all samples, so they can exceed it."
    )
    for e in estimated_shown:
        notes.append(
            f"§: {e['model']}'s noise ceiling estimated outside the test split: {e['what']}; "
            f"{e['noise_ceiling']['n_prompts']} prompts (`{e['command']}`)."
        )
    settings = ranking.get("settings", {})
    with_prior = settings.get("lexical_prior") or []
    if with_prior:
        n_predictors = sum(len(by_method) for by_method in ranking["predictors"].values())
        which = (
            "Every predictor scores"
            if len(with_prior) == n_predictors
            else f"{len(with_prior)} of the predictors ({', '.join(f'`{p}`' for p in with_prior)}) score"
        )
        notes.append(
            f"{which} with a lexical prior: a TF-IDF + ridge regression fitted on its own train prompts is "
            "added to the encoder's score, in training (out-of-fold) and in serving (`train.lexical_prior`)."
        )
    blended = sorted({m for by_method in ranking["predictors"].values() for m in by_method if "+" in m})
    if blended:
        notes.append(
            f"{', '.join(f'`{m}`' for m in blended)}: a predictor's score plus a second regression (after the "
            "`+`: `tfidf`, TF-IDF + ridge; `decoder`, a ridge or pairwise head on a frozen causal LM's hidden "
            "states), weighted on val by the blend stage (`metrics/blend/<model>.json` says which reader and head)."
        )
    excluded = settings.get("excluded_test_prompts") or {}
    if excluded.get("n_prompts"):
        by = ", ".join(f"{ds} {n}" for ds, n in excluded.get("by_dataset", {}).items())
        notes.append(
            f"Left out of every τ_b above: {excluded['n_prompts']} test prompts ({by}) whose text is also a "
            "train or val prompt of some dataset (lowercased, whitespace collapsed): predictors saw them with a label "
            "(the serving simulation still replays them as traffic)."
        )
    notes.append(
        f"Prompt length counted with the `{settings.get('baseline_tokenizer', 'minilm-l6')}` tokenizer; "
        f"`metrics/ranking.json` also holds each cell's pair accuracy, on pairs with relative length gap "
        f"≥ δ={settings.get('delta')}."
    )
    lines += [f"- {n}" for n in notes]
    lines += _image(plots, "tau_b", "Kendall τ_b by eval model and predictor (plots/evaluate/tau_b.png)")
    lines += _harrell_lines(ranking, cols, methods, per_model, cross)

    eval_models = list(ranking["references"])
    for method in methods:
        rows = [m for m in train_models if method in ranking["predictors"][m]]  # a predictor of this method
        lines += [
            "",
            f"## Cross-model transfer, {METHOD_NAMES.get(method, method)}: τ_b (rows: trained on, "
            "columns: evaluated on, all datasets)",
            "",
            "| trained on | " + " | ".join(eval_models) + " |",
            "|" + "---|" * (len(eval_models) + 1),
        ]
        for model in rows:
            by_eval = ranking["predictors"][model][method]
            home = [model] if model in per_model else (members.get(model) or [])
            cells = []
            for e in eval_models:
                text = _fmt(by_eval.get(e, {}).get(OVERALL, {}).get("kendall_tau_b"))
                cells.append(f"**{text}**" if e in home and text != "–" else text)
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
        lines.append(
            "| *prompt length* | "
            + " | ".join(_fmt(ranking["references"][e][OVERALL]["prompt_length"]["kendall_tau_b"]) for e in eval_models)
            + " |"
        )
        if has_tfidf:
            lines.append(
                "| *TF-IDF + ridge* | "
                + " | ".join(
                    _fmt((ranking["references"][e][OVERALL].get("tfidf_ridge") or {}).get("kendall_tau_b"))
                    for e in eval_models
                )
                + " |"
            )
    if methods:
        lines += [
            "",
            "- **Bold**: in-domain, the predictor trained on that model's answers (a cross-model row: the model is "
            "one of its members); the other cells are transfers.",
        ]
    lines += _image(plots, "transfer", "Cross-model transfer (plots/evaluate/transfer.png)")
    lines += _method_difference_lines(ranking)
    return "\n".join(lines) + "\n"


def _cross_note(model: str, members: list[str] | None, eval_models: list[str], served: dict | None) -> str:
    """What a cross-model row is: its members (in-domain), the transfers, and whether it is served."""
    if members is None:
        text = (
            f"`{model}`: a cross-model predictor, trained on several models' answers; which ones is not recorded "
            f"(no `members` in `metrics/train/{model}-pairwise.json`), so its cells carry no † mark."
        )
    else:
        away = [e for e in eval_models if e not in members]
        text = (
            f"`{model}`: one predictor trained on the answers of {join_names(members)}: its cells on them are in-domain"
        )
        text += f", on {join_names(away)} a transfer (†)." if away else "."
    if served and served.get("model") == model:
        text += (
            f" It is the exported serving default, `{served['checkpoint']}` ({served['method']}; "
            f"as `{served['source']}` records it)."
        )
    return text


def _harrell_lines(
    ranking: dict, cols: list[tuple[str, str]], methods: list[str], per_model: list[str], cross: list[str]
) -> list[str]:
    """Harrell's C for the columns of an eval model with cut answers (evaluate writes it for each cell
    of such a model, its prompt-length reference included): the same rows as the τ_b table."""
    c_cols = [(m, g) for m, g in cols if "harrell_c" in (ranking["references"][m][g].get("prompt_length") or {})]
    if not c_cols:
        return []
    lines = [
        "",
        "### Harrell's C where answers were cut (¶)",
        "",
        "A cut length is only a lower bound, so τ_b, which takes it as exact, also scores pairs of unknown order; "
        "C counts only pairs whose order is known (labels differ and the shorter is uncut), score ties ½, "
        "0.5 = chance. Same rows and predictors as the τ_b table, same 95% bootstrap resamples.",
        "",
        "| method | " + " | ".join(f"{g} · {m}" for m, g in c_cols) + " |",
        "|" + "---|" * (len(c_cols) + 1),
    ]
    for method in methods:
        cells = []
        for m, g in c_cols:
            source = m if m in per_model else (per_model[0] if per_model else None)
            cells.append(_harrell_c(ranking["predictors"].get(source, {}).get(method, {}).get(m, {}).get(g)))
        lines.append(f"| {METHOD_NAMES.get(method, method)} | " + " | ".join(cells) + " |")
    for model in cross:
        for method, by_eval in ranking["predictors"][model].items():
            cells = [_harrell_c(by_eval.get(m, {}).get(g)) for m, g in c_cols]
            lines.append(f"| cross-model {METHOD_NAMES.get(method, method)}: `{model}` | " + " | ".join(cells) + " |")
    for ref, label in (("prompt_length", "prompt length (tokens)"), ("tfidf_ridge", "TF-IDF + ridge (train split)")):
        cells = [_harrell_c(ranking["references"][m][g].get(ref)) for m, g in c_cols]
        if any(c != "–" for c in cells):
            lines.append(f"| *{label}* | " + " | ".join(cells) + " |")
    return lines


def _method_difference_lines(ranking: dict) -> list[str]:
    """Pairwise minus each other method, all datasets: is the pairwise loss worth it?"""
    diffs = ranking.get("method_differences") or {}
    others = list(
        dict.fromkeys(
            m for by_eval in diffs.values() for by_group in by_eval.values() for m in by_group.get(OVERALL, {})
        )
    )
    if not others:
        return []
    lines = [
        "",
        "## Pairwise minus each other method: Δτ_b (paired bootstrap 95% CI, all datasets)",
        "",
        "Source: `metrics/ranking.json` (`dvc repro evaluate`), `method_differences`.",
        "",
        "| trained on → evaluated on | " + " | ".join(f"− {METHOD_NAMES.get(m, m)}" for m in others) + " |",
        "|" + "---|" * (len(others) + 1),
    ]
    for model, by_eval in diffs.items():
        for eval_model, by_group in by_eval.items():
            cells = []
            for method in others:
                d = by_group.get(OVERALL, {}).get(method)
                clear = d is not None and d["ci_low"] is not None and (d["ci_low"] > 0 or d["ci_high"] < 0)
                cells.append(_fmt(d["diff"], (d["ci_low"], d["ci_high"])) + (" *" if clear else "") if d else "–")
            lines.append(f"| {model} → {eval_model} | " + " | ".join(cells) + " |")
    lines += ["", "- Δ > 0: pairwise ranks better. *: the 95% interval excludes 0."]
    return lines
