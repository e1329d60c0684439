"""pairs@model: δ-filtered prompt pairs for ranking training -> data/pairs/<model>/.

Label: a prompt's length is the mean `output_tokens` over its samples. An answer cut at
max_tokens (finish_reason == "length") makes that mean a lower bound: the true length is at
least the observed one. So a truncated prompt may be the *longer* member of a pair (its true
length is larger still: the order holds and the relative gap only grows, so the δ test stays
passed) but never the *shorter* one (its true length could exceed its partner's and flip the
pair). Such pairs are dropped and counted (`dropped_for_truncation`).

Sampling (PARS): for each prompt of a split, draw partners uniformly from the same split until
N pairs pass the filter or 10·N draws were made; seeded; an unordered pair is kept once. Pairs
never cross splits (train pairs from train prompts, val pairs from val prompts).

Writes train.parquet and val.parquet (PAIRS schema), labels.parquet (one row per labelled
prompt: what train needs for in-batch pairs, pointwise and listwise targets), and
metrics/pairs/<model>.json (kept fraction, label balance, counts).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.contracts import (
    GENERATION_COUNTS,
    LABELS,
    PAIRS,
    PROMPTS,
    ensure_parent,
    generations_path,
    labels_path,
    pairs_dir,
    prompts_path,
    read_table,
    write_json,
    write_table,
)
from pipeline.errors import PARSError
from pipeline.params import PARAMS_HELP, Section, load_params
from pipeline.ranking.labels import check_known_prompts, keep_mask, prompt_labels
from pipeline.ranking.predictors import names

PAIR_SPLITS = ("train", "val")
# draws per prompt (partners x max_tries_factor) are held in memory at once: tens of MB at this cap
MAX_DRAWS_PER_PROMPT = 1_000_000


def count_passing_pairs(lengths: np.ndarray, truncated: np.ndarray, delta: float) -> tuple[int, int]:
    """Exact counts, over all n(n-1)/2 unordered pairs, of those passing the δ test and of those
    `keep_mask` keeps (δ test and truncation rule), in O(n log n): a split of tens of thousands of
    prompts has too many pairs to list.

    With lengths sorted, the partners that pass the δ test against a prompt as the longer member
    are a prefix (every value up to about (1-δ)·its length); equal lengths never pass (δ > 0), so
    each passing pair is counted once, from its longer member. The prefix's end is located with
    the same float test as `keep_mask`, so the counts agree with it exactly."""
    lengths = np.asarray(lengths, dtype=np.float64)
    order = np.argsort(lengths, kind="stable")
    length = lengths[order]
    shorter_ok = ~np.asarray(truncated, dtype=bool)[order]  # the shorter member must not be cut
    if len(length) < 2:
        return 0, 0
    values = np.unique(length)
    none = np.zeros(len(length), bool)

    def passes(m: np.ndarray) -> np.ndarray:  # values[m] as the shorter member passes against length
        inside = (m >= 0) & (m < len(values))
        small = values[np.clip(m, 0, len(values) - 1)]
        return inside & (small < length) & keep_mask(small, length, none, none, delta)

    last = np.searchsorted(values, (1 - delta) * length, side="right") - 1  # last passing value, up to rounding
    for _ in range(3):  # rounding moves the bound by an ulp: at most one distinct value either way
        last = np.where(passes(last) | (last < 0), last, last - 1)
        last = np.where(passes(last + 1), last + 1, last)
    prefix = np.where(last >= 0, np.searchsorted(length, values[np.clip(last, 0, None)], side="right"), 0)
    kept_before = np.concatenate([[0], np.cumsum(shorter_ok)])
    return int(prefix.sum()), int(kept_before[prefix].sum())


def sample_pairs(
    labels: pd.DataFrame, partners: int, max_tries_factor: int, delta: float, rng: np.random.Generator
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Draw up to `partners` kept partners per prompt of one split (module doc)."""
    labels = labels.sort_values("prompt_id").reset_index(drop=True)
    ids = labels["prompt_id"].to_numpy()
    lengths = labels["length"].to_numpy(np.float64)
    trunc = labels["truncated"].to_numpy(bool)
    n = len(ids)
    used: set[tuple[int, int]] = set()
    rows_a: list[int] = []
    rows_b: list[int] = []
    draws = kept = short = 0
    tries = partners * max_tries_factor
    for i in range(n):
        cands = rng.integers(0, n - 1, size=tries)
        cands = cands + (cands >= i)  # uniform over the other n-1 prompts
        ok = keep_mask(np.full(tries, lengths[i]), lengths[cands], np.full(tries, trunc[i]), trunc[cands], delta)
        got = 0
        for j, good in zip(cands, ok):
            draws += 1
            key = (min(i, j), max(i, j))
            if good and key not in used:
                used.add(key)
                rows_a.append(i)
                rows_b.append(int(j))
                got += 1
                if got == partners:
                    break
        kept += got
        short += got < partners
    a, b = np.asarray(rows_a, dtype=np.int64), np.asarray(rows_b, dtype=np.int64)
    pairs = pd.DataFrame(
        {
            "a": ids[a] if len(a) else np.array([], dtype=object),
            "b": ids[b] if len(b) else np.array([], dtype=object),
            "len_a": lengths[a],
            "len_b": lengths[b],
            "label": np.where(lengths[a] > lengths[b], 1, -1).astype(np.int8),
        }
    )
    delta_pass, full_pass = count_passing_pairs(lengths, trunc, delta)
    n_all = max(n * (n - 1) // 2, 1)
    stats = {
        "n_prompts": n,
        "n_truncated_prompts": int(trunc.sum()),
        "n_pairs": int(kept),
        "label_balance": float((pairs["label"] == 1).mean()) if kept else None,
        "kept_fraction_of_draws": kept / draws if draws else None,
        "pass_fraction_all_pairs": full_pass / n_all,
        "dropped_for_truncation": (delta_pass - full_pass) / n_all,
        "prompts_short_of_partners": int(short),
        "mean_partners_per_prompt": kept / n if n else 0.0,
    }
    return pairs, stats


def check_params(params: dict[str, Any]) -> tuple[float, int, int, int]:
    """The pairs section's (delta, partners, max_tries_factor, seed), checked: a bad value fails in
    one line naming its key, before any data is read or data/pairs/<model> is touched."""
    cfg = params if isinstance(params, Section) else Section(params, "pairs")
    cfg.only(("models", "delta", "partners", "max_tries_factor", "seed"))
    names(cfg, "models")  # one pairs@<model> stage per name
    delta = cfg.number("delta", positive=True, below=1)
    partners = cfg.integer("partners", minimum=1)
    factor = cfg.integer("max_tries_factor", minimum=1)
    seed = cfg.integer("seed", minimum=0)  # numpy seeds are non-negative
    if partners * factor > MAX_DRAWS_PER_PROMPT:
        raise PARSError(
            f"{cfg.where}.partners {partners} x max_tries_factor {factor}: at most "
            f"{MAX_DRAWS_PER_PROMPT:,} draws per prompt (they are held in memory at once)"
        )
    return delta, partners, factor, seed


def build_pairs(
    generations: pd.DataFrame,
    prompts: pd.DataFrame,
    params: dict[str, Any],
    model: str = "model",
    where: str | None = None,
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame, dict[str, Any]]:
    """Labels and δ-filtered pairs per split; raises a clear error when pairs cannot be formed
    (naming `where`, the generations file, when given)."""
    delta, partners, factor, seed = check_params(params)

    where = where or f"generations of {model}"
    missing = generations["sample"].isna()
    if missing.any():  # else check_generations would call these rows duplicates of each other
        raise ValueError(f"{where}: {int(missing.sum())} row(s) have no sample")
    labels = prompt_labels(generations, where=where)
    split_of = prompts.set_index("prompt_id")["split"]  # one row per prompt_id: read_table checks it
    check_known_prompts(labels["prompt_id"], split_of.index.to_series(), where=where)
    labels["split"] = labels["prompt_id"].map(split_of).astype(str)

    out: dict[str, pd.DataFrame] = {}
    metrics: dict[str, Any] = {"model": model, "delta": delta, "partners": partners, "n_labelled_prompts": len(labels)}
    # One generator per split, seeded from (seed, split), so val pairs do not move when train changes.
    for k, split in enumerate(PAIR_SPLITS):
        part = labels[labels["split"] == split]
        if len(part) < 2:
            raise ValueError(
                f"model {model}: the {split} split has {len(part)} prompt(s) with answers; "
                f"at least 2 are needed to form pairs"
            )
        rng = np.random.default_rng([seed, k])
        pairs, stats = sample_pairs(part, partners, factor, delta, rng)
        if pairs.empty:
            raise ValueError(
                f"model {model}: no {split} pair passes the filter (delta={delta}, "
                f"{len(part)} prompts, {stats['n_truncated_prompts']} truncated); "
                f"answer lengths are too alike or too many answers hit max_tokens"
            )
        out[split] = pairs
        metrics[split] = stats
    return out, labels[LABELS.names], metrics


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="pars pairs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="generation model name (one of pairs.models)")
    ap.add_argument("--params", default=None, help=PARAMS_HELP)
    ap.add_argument("--data", default="data", help="data root")
    ap.add_argument("--metrics", default="metrics/pairs", help="where <model>.json goes")
    args = ap.parse_args(argv)

    params = load_params("pairs", args.params)
    check_params(params)
    if args.model in ("", ".", "..") or "/" in args.model or "\\" in args.model:
        # data/pairs/<model> is deleted and rewritten: it must stay under data/pairs
        raise PARSError(f"--model {args.model!r}: must be a plain name (no '/', not '.' or '..')")
    out = pairs_dir(args.model, args.data)
    # where the stage writes, checked before anything is read or deleted
    for flag, path in (("--data", out / "train.parquet"), ("--metrics", Path(args.metrics) / f"{args.model}.json")):
        try:
            ensure_parent(path, create=False)
        except PARSError as exc:
            raise PARSError(f"{flag}: {exc}") from None
    gen_file = generations_path(args.model, args.data)
    if not gen_file.exists():
        root = gen_file.parent.parent
        have = sorted(d.name for d in root.iterdir() if (d / gen_file.name).is_file()) if root.is_dir() else []
        raise FileNotFoundError(
            f"model {args.model!r} has no generations: {gen_file} does not exist (generations exist for: "
            f"{', '.join(have) or 'none'}; a model listed in generate.models gets them with "
            f"`dvc repro generate@{args.model}`)"
        )
    generations = read_table(gen_file, GENERATION_COUNTS)
    prompts = read_table(prompts_path(args.data), PROMPTS)
    pairs, labels, metrics = build_pairs(generations, prompts, params, model=args.model, where=str(gen_file))

    if out.exists():  # the stage rewrites its output whole
        shutil.rmtree(out)
    for split, df in pairs.items():
        write_table(df, out / f"{split}.parquet", PAIRS)
    write_table(labels, labels_path(args.model, args.data), LABELS)
    # train forms in-batch pairs with the same δ: it reads it here rather than from another section
    write_json(
        {k: metrics[k] for k in ("model", "delta", "partners")}
        | {"max_tries_factor": int(params["max_tries_factor"]), "seed": int(params["seed"])},
        out / "meta.json",
    )
    write_json(metrics, Path(args.metrics) / f"{args.model}.json")
    t, v = metrics["train"], metrics["val"]
    print(
        f"pairs {args.model}: train {t['n_pairs']} pairs from {t['n_prompts']} prompts "
        f"(balance {t['label_balance']:.2f}, kept {t['kept_fraction_of_draws']:.2f} of draws), "
        f"val {v['n_pairs']} pairs from {v['n_prompts']} prompts -> {out}"
    )
    return 0
