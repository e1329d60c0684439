"""Can the fine-tuned MiniLM learn from the frozen Qwen reader's head? Writes data roots for `pars train`
whose ChatGPT train labels mix each answer's length with the head's out-of-fold estimate. Val only.

The blend's Qwen pairwise head ranks ChatGPT's val first turns better (0.444) than the fine-tuned
MiniLM-L6 (0.410). If the MiniLM's gap were label noise (one sampled answer per prompt), training it on
denoised targets (distillation) would lift it. This fits `--folds` pairwise heads
(`DecoderMLPHead`, the blend's settings) on the decoder features of ChatGPT's train first turns, each
scoring the fold it did not see; the out-of-fold scores are calibrated to log(1 + length) by a least
squares line, and for each alpha of `--alphas` a data root is written under `--out` whose labels hold

    length' = exp(alpha * log(1 + length) + (1 - alpha) * calibrated score) - 1

for those prompts (later turns, val and test unchanged; the rest of the data root links to `--data`).
Then train on it and compare val tau_b (against the true val labels) with the committed model:

    python benchmarks/distill_labels.py --features-cache /tmp/qwen.npz --alphas 0.5,0 --out /tmp/distill
    pars train --model chatgpt --method pairwise --data /tmp/distill/a0.5/data --models /tmp/distill/a0.5/models \
        --metrics /tmp/distill/a0.5/metrics --plots /tmp/distill/a0.5/plots

The features cache is benchmarks/decoder_features.py's (layers 8/12/16 of the blend's reader, its
layers when this was measured; every ChatGPT train and val first turn); without one, the decoder
computes it (about 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decoder_features import add_reader_flags, features_of, head_settings  # noqa: E402

from pipeline.cli import comma_numbers  # noqa: E402
from pipeline.contracts import labels_path, pairs_dir, prompts_path, write_json  # noqa: E402
from pipeline.ranking.metrics import kendall_tau_b  # noqa: E402


def mixed_lengths(lengths: np.ndarray, calibrated: np.ndarray, alpha: float) -> np.ndarray:
    """Lengths whose log(1 + length) is alpha of the answer's and 1 - alpha of the teacher's estimate."""
    return np.expm1(alpha * np.log1p(lengths) + (1 - alpha) * calibrated)


def out_of_fold(x: np.ndarray, y: np.ndarray, cut: np.ndarray, folds: int, settings: dict) -> np.ndarray:
    """Each prompt's score from a pairwise head (DecoderMLPHead.fit's `settings`) trained on the other folds."""
    from pipeline.ranking.decoder import DecoderMLPHead

    fold = np.random.default_rng(0).integers(0, folds, len(y))
    scores = np.zeros(len(y))
    for k in range(folds):
        held = fold == k
        scores[held] = DecoderMLPHead.fit(x[~held], y[~held], cut[~held], **settings).predict(x[held])
        print(f"distill_labels: fold {k + 1}/{folds}", file=sys.stderr, flush=True)
    return scores


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_reader_flags(ap, layers="8,12,16")
    ap.add_argument(
        "--alphas",
        type=comma_numbers(float),
        default="0.5,0",
        help="comma-separated weights of the answer's own length",
    )
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=3, help="MLPs per fold's head")
    ap.add_argument("--out", required=True, help="writes <out>/a<alpha>/data and <out>/teacher.json")
    args = ap.parse_args(argv)
    layers, alphas = sorted(set(args.layers)), args.alphas
    if not all(0 <= a <= 1 for a in alphas) or args.folds < 2 or args.seeds < 1:
        ap.error("--alphas in [0, 1], --folds >= 2, --seeds >= 1")
    data = Path(args.data).resolve()
    for path in (prompts_path(data), labels_path("chatgpt", data)):
        if not path.exists():
            sys.exit(f"distill_labels: {path} is missing (dvc repro pairs@chatgpt)")

    settings = {**head_settings(), "seeds": args.seeds}  # the blend's head, --seeds MLPs; read before the slow part
    labels = pd.read_parquet(labels_path("chatgpt", data))
    prompts = pd.read_parquet(prompts_path(data))
    first = prompts[prompts["dataset"] == "sharegpt"][["prompt_id", "prompt"]].merge(labels, on="prompt_id")
    train = first[first["split"] == "train"].reset_index(drop=True)
    x, _, _, where = features_of(
        args.decoder,
        layers,
        args.max_length,
        16,
        train["prompt_id"].tolist(),
        train["prompt"].tolist(),
        args.features_cache,
    )
    y = train["length"].to_numpy(float)
    teacher = out_of_fold(x, y, train["truncated"].to_numpy(bool), args.folds, settings)
    slope, intercept = np.polyfit(teacher, np.log1p(y), 1)
    calibrated = slope * teacher + intercept
    facts = {
        "train_first_turns": len(train),
        "train_prompts": int((labels["split"] == "train").sum()),
        "features_from": where,
        "teacher_out_of_fold_tau_b": round(float(kendall_tau_b(teacher, y)), 4),
        "calibration": {"slope": float(slope), "intercept": float(intercept)},
        "data_roots": {},
    }
    for alpha in alphas:
        root = Path(args.out) / f"a{alpha:g}" / "data"
        pdir = pairs_dir("chatgpt", root)
        pdir.mkdir(parents=True, exist_ok=True)
        for link, target in [(root / "prompts", data / "prompts")] + [
            (pdir / name, pairs_dir("chatgpt", data) / name) for name in ("train.parquet", "val.parquet", "meta.json")
        ]:
            if not link.exists():
                link.symlink_to(target)
        mixed = labels.copy()
        at = mixed["prompt_id"].map(dict(zip(train["prompt_id"], mixed_lengths(y, calibrated, alpha))))
        mixed["length"] = at.fillna(mixed["length"])
        mixed.to_parquet(labels_path("chatgpt", root), index=False)
        facts["data_roots"][f"{alpha:g}"] = str(root)
    print(
        f"distill_labels: teacher out-of-fold tau_b {facts['teacher_out_of_fold_tau_b']}; wrote {facts['data_roots']}"
    )
    write_json(facts, Path(args.out) / "teacher.json")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
