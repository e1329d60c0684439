"""How an answer cap (max_tokens) censors a generator's sampled answers, and what each cap costs.

    python benchmarks/answer_caps.py           # SmolLM2, cap 1024, 12 train prompts per dataset
    python benchmarks/answer_caps.py --json metrics/choices/answer_caps-rp1.0.json
    python benchmarks/answer_caps.py --repetition-penalty 1.1 --json metrics/choices/answer_caps-rp1.1.json

Generates k answers per prompt once, at the largest cap, on train-split prompts (never test), then
censors them at every smaller cap: an answer of n tokens under cap c is n if n < c, else a truncated
lower bound c, which is what a run with max_tokens = c would have recorded, in distribution. Prints,
per cap: the share of answers cut, the share of prompts with a cut answer (the pairs stage treats
their label as a lower bound), the noise ceiling (tau_b between two samples of the same prompts),
the share of delta-filtered pairs kept, and the generation time per prompt at the measured speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.cli import comma_numbers  # noqa: E402


def censor_table(lengths: np.ndarray, caps: list[int], delta: float, tokens_per_s: float) -> list[dict]:
    """One row per cap from uncensored-at-max lengths (prompts x k)."""
    from pipeline.ranking.labels import keep_mask
    from pipeline.ranking.metrics import noise_ceiling

    rows = []
    n_prompts, k = lengths.shape
    i, j = np.triu_indices(n_prompts, 1)
    for cap in caps:
        cut = lengths >= cap
        observed = np.minimum(lengths, cap)
        label, label_cut = observed.mean(axis=1), cut.any(axis=1)
        kept = keep_mask(label[i], label[j], label_cut[i], label_cut[j], delta)
        ceiling = noise_ceiling(observed, n_boot=200)
        rows.append(
            {
                "max_tokens": cap,
                "answers_cut": round(float(cut.mean()), 3),
                "prompts_with_a_cut_answer": round(float(label_cut.mean()), 3),
                "median_answer_tokens": float(np.median(observed)),
                "noise_ceiling_tau_b": round(ceiling["kendall_tau_b"], 3) if ceiling else None,
                "delta_pairs_kept": round(float(kept.mean()), 3),
                "tokens_per_prompt": round(float(observed.sum(axis=1).mean()), 1),
                "seconds_per_prompt": round(float(observed.sum(axis=1).mean()) / tokens_per_s, 2),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/base/smollm2", help="HF dir (default: the materialized SmolLM2)")
    parser.add_argument("--prompts-file", default="data/prompts/prompts.parquet")
    parser.add_argument("--datasets", default="alpaca_eval,arena_hard,sharegpt,humaneval")
    parser.add_argument("--per-dataset", type=int, default=12, help="train-split prompts per dataset")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=1024, help="the largest cap: generated once at this")
    parser.add_argument("--caps", type=comma_numbers(int, minimum=1), default="256,384,512,768,1024")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=0.2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    caps = sorted({*args.caps, args.max_tokens})
    if caps[-1] > args.max_tokens:
        raise SystemExit(f"--caps: every cap must be <= --max-tokens {args.max_tokens}, got {caps[-1]}")
    model = Path(args.model)
    if not (model / "config.json").exists():
        raise SystemExit(f"--model {model}: no config.json (run `dvc repro materialize` first)")
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))

    import pandas as pd

    from pipeline.backends import PromptItem
    from pipeline.backends.vllm_backend import VllmBackend, _on_cpu

    prompts = pd.read_parquet(args.prompts_file)
    datasets = args.datasets.split(",")
    train = prompts[(prompts["split"] == "train") & prompts["dataset"].isin(datasets)].sort_values("prompt_id")
    chosen = train.groupby("dataset", sort=False, group_keys=False).head(args.per_dataset)
    if chosen.empty:
        raise SystemExit(f"--datasets {args.datasets}: no train-split prompts in {args.prompts_file}")
    items = [PromptItem(r.prompt_id, r.prompt, r.dataset, r.source_id) for r in chosen.itertuples()]
    backend = VllmBackend(
        {
            "model": str(model),
            "k": args.k,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "repetition_penalty": args.repetition_penalty,
            "max_tokens": args.max_tokens,
            "seed": 42,
            "dtype": "float32",
            "max_num_seqs": 64,
            "max_model_len": 2048,
            "cpu_kv_cache_gib": 2,  # as params.yaml's smollm2, and eager on a CPU (a GPU: vLLM's own)
            **({"enforce_eager": True} if _on_cpu() else {}),
        }
    )
    backend.start()
    t0 = time.perf_counter()
    results = dict(backend.generate(items))
    wall = time.perf_counter() - t0
    backend.close()
    skipped = dict(backend.skipped)  # prompts too long for max_model_len - max_tokens: say so
    if skipped:
        print(f"answer_caps: {len(skipped)} of {len(items)} prompts skipped: {skipped}")
    lengths = np.array([[s.output_tokens for s in results[p.prompt_id]] for p in items if p.prompt_id in results])
    if lengths.size == 0:
        raise SystemExit(f"answer_caps: no answers ({len(items)} prompts chosen, {len(skipped)} skipped)")
    tokens_per_s = float(lengths.sum()) / wall
    by_dataset = {}
    for name in datasets:
        rows = [p.prompt_id in results and p.dataset == name for p in items]
        sub = np.array([[s.output_tokens for s in results[p.prompt_id]] for p, ok in zip(items, rows) if ok])
        if len(sub):
            by_dataset[name] = {
                f"cut_at_{c}": round(float((sub >= c).mean()), 3) for c in caps if c in (256, 512, args.max_tokens)
            }
    out = {
        "model": str(model),
        "split": "train (the test split was not used)",
        "prompts": len(lengths),
        "skipped_prompts": skipped,
        "k": args.k,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "repetition_penalty": args.repetition_penalty,
        "generated_at_max_tokens": args.max_tokens,
        "wall_s": round(wall, 1),
        "tokens_per_s": round(tokens_per_s, 1),
        "mean_cv_uncut_prompts": round(
            statistics.mean(
                float(np.std(r, ddof=1) / np.mean(r))  # ddof=1: as the lengths stage computes it
                for r in lengths
                if (r < args.max_tokens).all() and np.mean(r) > 0
            ),
            3,
        )
        if ((lengths < args.max_tokens).all(axis=1)).any()
        else None,
        "caps": censor_table(lengths, caps, args.delta, tokens_per_s),
        "cut_share_by_dataset": by_dataset,
    }
    header = list(out["caps"][0])
    print(
        f"{out['prompts']} prompts x {args.k}, repetition_penalty {args.repetition_penalty}: "
        f"{out['wall_s']} s, {out['tokens_per_s']} tokens/s"
    )
    print("  ".join(f"{h:>12.12}" for h in header))
    for row in out["caps"]:
        print("  ".join(f"{row[h]!s:>12.12}" for h in header))
    print(json.dumps(out["cut_share_by_dataset"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
