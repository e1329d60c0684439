"""Should ChatGPT's MiniLM be trained on top of the Qwen reader's head rather than blended with it
afterwards? Val only.

`train.lexical_prior` trains the encoder on top of TF-IDF + ridge: the regression's out-of-fold
estimate is added to the encoder's score in training, so the encoder learns what it misses. The blend
stage instead combines the trained encoder with the frozen reader's pairwise head after both are
fitted, its weight chosen on val. This trains ChatGPT's pairwise predictor (params.yaml's train
section) with the head as that prior:

- the head (`DecoderMLPHead`, the blend's settings) scores each train first turn from `--folds` heads
  that did not see it, and the later turns and val prompts from one head fitted on every train first
  turn (the blend's head is fitted on first turns only);
- each variant of `--priors` calibrates its parts to log(1 + length) by least squares on train:
  `decoder` (the head alone) or `decoder+lexical` (the head and train's TF-IDF prior);
- `pars train`'s own code trains the pairwise predictor with that prior, and its best epoch's val
  tau_b is compared with the prior alone, the committed predictor and the committed blend.

    python benchmarks/decoder_prior.py --features-cache /tmp/qwen.npz --json metrics/choices/decoder_prior-chatgpt-pairwise.json

The features cache is benchmarks/decoder_features.py's, with `--later-turns` (the blend's layers of
every ChatGPT train and val prompt); without one the decoder computes it (about 20 minutes on 2
cores). Each variant then trains for about 4 minutes. Heavy: run it on idle cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decoder_features import add_reader_flags, features_of, head_settings  # noqa: E402
from distill_labels import out_of_fold  # noqa: E402

from pipeline.cli import comma_names  # noqa: E402
from pipeline.contracts import labels_path, nested_value, prompts_path, read_json, write_json  # noqa: E402
from pipeline.ranking.metrics import kendall_tau_b  # noqa: E402
from pipeline.serving.results import is_finite_number  # noqa: E402

PRIORS = ("decoder", "decoder+lexical")


def calibrated_prior(parts_train: list[np.ndarray], parts_val: list[np.ndarray], lengths) -> tuple:
    """(train prior, val prior, coefficients): the least-squares line of log(1 + length) on the parts,
    fitted on train, so the prior is in the units the graded margin charges (log length)."""
    a = np.column_stack([*parts_train, np.ones(len(lengths))])
    coef, *_ = np.linalg.lstsq(a, np.log1p(np.asarray(lengths, float)), rcond=None)
    return a @ coef, np.column_stack([*parts_val, np.ones(len(parts_val[0]))]) @ coef, coef


def train_with_prior(variant: str, decoder_score: dict[str, float], data_root: str) -> dict:
    """`pars train --model chatgpt --method pairwise` with the prior of `variant` in place of the lexical
    prior alone; its val figures (nothing is written outside a temporary directory)."""
    from pipeline.params import load_params
    from pipeline.ranking.data import RankingDataModule
    from pipeline.train import train_one

    cfg = load_params("train")
    lexical_fit, facts = RankingDataModule.fit_lexical_prior, {}

    def fit_prior(self, **kwargs):
        lexical = lexical_fit(self, **kwargs)  # sets each table's TF-IDF prior (out-of-fold on train)
        parts = [[np.array([decoder_score[p] for p in t.ids]) for t in (self.train_table, self.val_table)]]
        if variant == "decoder+lexical":
            parts.append([self.train_table.prior, self.val_table.prior])
        train_prior, val_prior, coef = calibrated_prior(
            [p[0] for p in parts], [p[1] for p in parts], self.train_table.lengths
        )
        self.train_table.prior, self.val_table.prior = train_prior, val_prior
        facts["coefficients"] = [round(float(c), 4) for c in coef]
        facts["prior_alone_val_tau_b"] = round(float(kendall_tau_b(val_prior, self.val_table.lengths)), 4)
        return lexical

    RankingDataModule.fit_lexical_prior = fit_prior
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            res = train_one(
                "chatgpt",
                "pairwise",
                cfg,
                data_root=data_root,
                models_root=f"{tmp}/models",
                metrics_dir=f"{tmp}/metrics",
                plots_dir=f"{tmp}/plots",
            )
            curve = pd.read_csv(f"{tmp}/plots/chatgpt-pairwise.csv")
    finally:
        RankingDataModule.fit_lexical_prior = lexical_fit
    return {
        "val_tau_b": round(float(res["val_tau_b"]), 4),
        "best_epoch": int(res["best_epoch"]),
        "val_tau_b_by_epoch": [round(float(t), 4) for t in curve["val_tau_b"]],
        **facts,
        "run_seconds": round(time.perf_counter() - t0, 1),
    }


def committed_val(path: Path, *keys: str) -> float | None:
    """A committed val figure (the predictor's train metrics, the blend's checkpoint), None if absent."""
    value = nested_value(read_json(path), *keys) if path.is_file() else None
    return round(float(value), 4) if is_finite_number(value) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_reader_flags(ap, layers="8,10,12,14,16")
    ap.add_argument("--folds", type=int, default=5, help="heads scoring the train first turns out of fold")
    ap.add_argument(
        "--priors",
        type=comma_names(PRIORS),
        default=",".join(PRIORS),
        help=f"comma-separated variants to train: {', '.join(PRIORS)}",
    )
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    variants = args.priors
    if args.folds < 2:
        ap.error("--folds >= 2")
    for path in (prompts_path(args.data), labels_path("chatgpt", args.data)):
        if not Path(path).exists():
            sys.exit(f"decoder_prior: {path} is missing (dvc repro pairs@chatgpt)")

    from pipeline.params import load_params

    settings = head_settings()  # read before the slow part, as are the two below
    if not load_params("train").get("lexical_prior"):
        sys.exit("decoder_prior: params train.lexical_prior is off; the prior replaces its fit")
    head_datasets = load_params("blend")["decoder"].get("datasets")  # the blend head's prompts (null: all)
    labels = pd.read_parquet(labels_path("chatgpt", args.data))
    prompts = pd.read_parquet(prompts_path(args.data))
    rows = labels[labels["split"].isin(["train", "val"])].merge(
        prompts[["prompt_id", "prompt", "dataset"]], on="prompt_id"
    )
    x, _, _, where = features_of(
        args.decoder,
        sorted(set(args.layers)),
        args.max_length,
        16,
        rows["prompt_id"].tolist(),
        rows["prompt"].tolist(),
        args.features_cache,
    )
    y = rows["length"].to_numpy(float)
    cut = rows["truncated"].to_numpy(bool)
    first = ((rows["split"] == "train") & (rows["dataset"].isin(head_datasets) if head_datasets else True)).to_numpy()

    from pipeline.ranking.decoder import DecoderMLPHead

    score = np.zeros(len(rows))
    score[first] = out_of_fold(x[first], y[first], cut[first], args.folds, settings)
    full = DecoderMLPHead.fit(x[first], y[first], cut[first], **settings)
    score[~first] = full.predict(x[~first])
    val, later = (rows["split"] == "val").to_numpy(), (~first & (rows["split"] == "train")).to_numpy()
    result = {
        "question": "ChatGPT's pairwise MiniLM trained on top of the Qwen reader's pairwise head (as train.lexical_prior "
        "trains it on top of TF-IDF), against blending the two after training (the blend stage)",
        "split": "val only",
        "how": "python benchmarks/decoder_prior.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "features_from": where,
        "layers": sorted(set(args.layers)),
        "head": settings,
        "head_val_tau_b": round(float(kendall_tau_b(score[val], y[val])), 4),
        "head_out_of_fold_tau_b_train_first_turns": round(float(kendall_tau_b(score[first], y[first])), 4),
        "head_tau_b_train_later_turns": round(float(kendall_tau_b(score[later], y[later])), 4),
        "n_prompts": {
            "train_first_turns": int(first.sum()),
            "train_later_turns": int(later.sum()),
            "val": int(val.sum()),
        },
        "committed_val_tau_b": {
            "chatgpt/pairwise": committed_val(Path("metrics/train/chatgpt-pairwise.json"), "val_tau_b"),
            "chatgpt/pairwise+decoder": committed_val(
                Path("models/chatgpt/pairwise+decoder/pars.json"), "decoder", "val_tau_b"
            ),
        },
        "runs": {},
    }
    decoder_score = dict(zip(rows["prompt_id"], score))
    for variant in variants:
        print(f"decoder_prior: training chatgpt/pairwise on the {variant} prior", file=sys.stderr, flush=True)
        result["runs"][variant] = train_with_prior(variant, decoder_score, args.data)
        print(f"decoder_prior: {variant}: {result['runs'][variant]}", file=sys.stderr, flush=True)
        if args.json:
            write_json(result, args.json)
    print(f"| head alone | {result['head_val_tau_b']} |")
    for name, value in result["committed_val_tau_b"].items():
        print(f"| committed {name} | {value} |")
    for variant, run in result["runs"].items():
        print(f"| trained on the {variant} prior (prior alone) | {run['val_tau_b']} ({run['prior_alone_val_tau_b']}) |")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
