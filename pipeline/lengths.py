"""Stage `lengths`: answer-length summary per (model, dataset) -> metrics/lengths.json + plot.

Per (model, dataset): prompts, samples, mean and median output tokens, the mean coefficient
of variation of a prompt's lengths across its samples (models with k >= 2: how noisy the
label is), and the fraction of answers cut at max_tokens.

Without --models it describes every folder under --generations that holds a generations.parquet. DVC
does not delete the outputs of stages a profile removed, so after a switch (`pars profile`, or `dvc
pull` of another profile's outputs) the old models' folders stay there; a folder none of whose prompt
ids is in the prompts table answers another profile's prompts and is skipped, every skipped folder
named in one printed line. A folder that answers some of the table's prompts and not others is an
error, as is any folder --models names.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.contracts import (
    GENERATION_COUNTS,
    PROMPTS,
    ensure_parent,
    prompts_path,
    read_table,
    write_figure,
    write_json,
)
from pipeline.errors import PARSError
from pipeline.ranking.labels import check_generations, check_known_prompts


def summarise(gens: pd.DataFrame) -> dict:
    per_prompt = gens.groupby("prompt_id")["output_tokens"].agg(["mean", "std", "count"])
    multi = per_prompt[per_prompt["count"] >= 2]
    cv = (multi["std"] / multi["mean"].where(multi["mean"] > 0)).dropna()
    return {
        "prompts": int(len(per_prompt)),
        "samples": int(len(gens)),
        "mean_output_tokens": round(float(gens["output_tokens"].mean()), 1),
        "median_output_tokens": float(gens["output_tokens"].median()),
        "mean_cv": round(float(cv.mean()), 4) if len(cv) else None,
        "truncated_fraction": round(float((gens["finish_reason"] == "length").mean()), 4),
        "mean_reasoning_tokens": round(float(gens["reasoning_tokens"].mean()), 1),
    }


def answers_other_prompts(gens: pd.DataFrame, prompts: pd.DataFrame) -> bool:
    """Whether a generations table answers none of the prompts table's prompts: left by another
    profile (its datasets, so its prompt ids, are not this one's). An empty table is not: it fails
    check_generations, naming its file."""
    return not gens.empty and not gens["prompt_id"].isin(prompts["prompt_id"]).any()


def length_table(
    models: list[str], prompts: pd.DataFrame, root: Path, skip_other_prompts: bool = False
) -> tuple[dict, dict[str, pd.DataFrame]]:
    """Per model under `root`: the summary of its answers overall and per dataset. With
    `skip_other_prompts` a model folder whose answers are to none of `prompts` is left out and
    named in one printed line; otherwise it fails check_known_prompts, as a partly stale one does."""
    table, frames, skipped = {}, {}, []
    for model in models:
        path = root / model / "generations.parquet"
        gens = read_table(path, GENERATION_COUNTS)
        if skip_other_prompts and answers_other_prompts(gens, prompts):
            skipped.append(model)
            continue
        check_generations(gens, where=str(path))  # the rules pairs applies: no mean of -50 or NaN tokens
        check_known_prompts(gens["prompt_id"], prompts["prompt_id"], where=str(path))
        gens = gens.merge(prompts[["prompt_id", "dataset"]], on="prompt_id", how="left")
        frames[model] = gens
        table[model] = {"all": summarise(gens)}
        for dataset, part in gens.groupby("dataset"):
            table[model][dataset] = summarise(part)
    if skipped:
        print(
            f"lengths: skipped {len(skipped)} folder(s) under {root} whose answers are to none of the prompts "
            f"table's prompts (left by another profile's generate; not described): {', '.join(skipped)}"
        )
    if not table:
        raise FileNotFoundError(
            f"no generations under {root} answer the prompts table's prompts (run `pars generate` first)"
        )
    return table, frames


def plot(frames: dict[str, pd.DataFrame], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    longest = max(int(f["output_tokens"].max()) for f in frames.values())
    # log-spaced bins with edges between whole numbers: every bin holds at least one possible length
    # (finer log bins leave empty teeth between 1, 2, 3 ... tokens)
    edges = np.unique(np.round(np.logspace(0, np.log10(longest + 1), 40))) - 0.5
    for model, gens in frames.items():
        cut = float(gens["finish_reason"].eq("length").mean())
        ax.hist(
            gens["output_tokens"].clip(lower=1),
            bins=np.append(edges, longest + 0.5) if edges[-1] < longest + 0.5 else edges,
            histtype="step",
            linewidth=1.6,
            weights=np.full(len(gens), 1.0 / len(gens)),  # share of the model's answers: comparable across n
            label=f"{model} (n={len(gens)}" + (f", {cut:.0%} cut at max_tokens)" if cut else ")"),
        )
    ax.set_xscale("log")
    ax.set_xlabel("answer length (output tokens, log scale)")
    ax.set_ylabel("share of answers in the bin")
    ax.set_title("Answer-length distributions per model")
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_figure(fig, out, dpi=120)
    plt.close(fig)


def check_plot_format(path: str) -> None:
    """--plot's suffix names the image format: one matplotlib cannot write fails now, in one line."""
    from matplotlib.figure import Figure

    suffix = Path(path).suffix.lstrip(".").lower()
    known = Figure().canvas.get_supported_filetypes()
    if not suffix:
        raise PARSError(f"--plot {path}: no suffix to name the image format (known: {', '.join(sorted(known))})")
    if suffix not in known:
        raise PARSError(f"--plot {path}: matplotlib cannot write {suffix!r} images (known: {', '.join(sorted(known))})")


def print_table(table: dict) -> None:
    head = (
        f"{'model':<18} {'dataset':<12} {'prompts':>7} {'samples':>7} {'mean':>7} {'median':>7} {'cv':>6} {'trunc':>6}"
    )
    print(head)
    print("-" * len(head))
    for model, rows in table.items():
        for dataset, s in rows.items():
            cv = f"{s['mean_cv']:.3f}" if s["mean_cv"] is not None else "-"
            print(
                f"{model:<18} {dataset:<12} {s['prompts']:>7} {s['samples']:>7} {s['mean_output_tokens']:>7.1f} "
                f"{s['median_output_tokens']:>7.0f} {cv:>6} {s['truncated_fraction']:>6.3f}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pars lengths", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="*",
        help="model names to describe (default: every dir under --generations but those that answer none of "
        "the prompts table's prompts, skipped and named)",
    )
    parser.add_argument(
        "--generations", default="data/generations", help="generations root, <model>/... (default: %(default)s)"
    )
    parser.add_argument("--prompts", default=str(prompts_path()), help="the prompts table (default: %(default)s)")
    parser.add_argument("--metrics", default="metrics/lengths.json", help="JSON to write (default: %(default)s)")
    parser.add_argument("--plot", default="plots/lengths.png", help="figure to write (default: %(default)s)")
    args = parser.parse_args(argv)
    for out in (args.metrics, args.plot):  # an output under a file: one line, before any work
        ensure_parent(out)
    check_plot_format(args.plot)  # before the metrics file is replaced
    root = Path(args.generations)
    models = (
        args.models or sorted(p.name for p in root.iterdir() if (p / "generations.parquet").exists())
        if root.exists()
        else []
    )
    if not models:
        raise FileNotFoundError(f"no generations found under {root} (run `pars generate` first)")
    # folders found, not named: one left by another profile is skipped (named in one line), not fatal
    table, frames = length_table(models, read_table(args.prompts, PROMPTS), root, skip_other_prompts=not args.models)
    write_json(table, args.metrics)
    plot(frames, Path(args.plot))
    print_table(table)
    return 0
