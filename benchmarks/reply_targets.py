"""Does teaching the encoder what the answer will be about, or how a bigger reader reads the prompt,
help it rank answer lengths? Val only.

A ranker sees only the prompt, but its training prompts come with the recorded answer. Here the
pairwise predictor is trained as `pars train` trains it, plus an auxiliary loss: from the pooled
vector the head reads, a linear map predicts the answer's own sentence embedding (the frozen
encoder's mean-pooled embedding of the answer's first and last tokens), by cosine distance,
weighted by --weights. The answer embedding says whether an answer is code, a list, an essay or a
one-line acknowledgement, which its length alone does not; serving is unchanged (the map is
dropped). Nothing of the pipeline changes: the experiment swaps pipeline.train's LightningModule
for a subclass that adds the term.

With `--target decoder` the target is instead the prompt's own features under the blend's frozen
decoder reader (Qwen2.5-Coder-0.5B: `benchmarks/decoder_features.py`'s, standardised and reduced to
their top `--target-dim` principal components on train): representation distillation, which asks
whether the MiniLM can learn to read a prompt as the reader that ranks better (val 0.449 against
0.410) does, where distilling its length estimate (`benchmarks/distill_labels.py`) did not help.

    python benchmarks/reply_targets.py --weights 0.5,2 --out metrics/choices/reply_targets-chatgpt-pairwise.json
    python benchmarks/reply_targets.py --target decoder --features-cache <npz> --weights 0.5,2 \
        --out metrics/choices/reader_targets-chatgpt-pairwise.json

Writes the val tau_b per weight (and per epoch) beside the pipeline's committed predictor's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decoder_features import add_reader_flags, features_of  # noqa: E402

from pipeline.cli import comma_numbers  # noqa: E402
from pipeline.contracts import generations_path, prompts_path, write_json  # noqa: E402
from pipeline.params import PARAMS_HELP, load_params  # noqa: E402
from pipeline.ranking import lightning as ranking_lightning  # noqa: E402

QUESTIONS = {
    "answer": "Does an auxiliary loss that predicts the answer's sentence embedding from the prompt's "
    "pooled vector help the pairwise predictor rank answer lengths?",
    "decoder": "Does an auxiliary loss that predicts the prompt's features under the blend's frozen Qwen reader "
    "(top principal components) from the MiniLM's pooled vector teach it to read, and rank, as that reader does?",
}
RANKER = ranking_lightning.RankerModule  # the pipeline's own; train_one imports the name at call time


def answer_embeddings(texts: list[str], encoder: str, max_length: int, batch_size: int = 64) -> np.ndarray:
    """The frozen encoder's mean-pooled, L2-normalised embedding of each answer (head and tail
    kept when longer than max_length, as prompts are), in bfloat16 where the CPU has it natively."""
    from pipeline.encoders import resolve_encoder
    from pipeline.hardware import cpu_has_native_bf16
    from pipeline.ranking.model import encode_prompts, load_encoder, load_tokenizer, pad_batch

    path = resolve_encoder(encoder)
    tok, model = load_tokenizer(path), load_encoder(path).eval()
    ids = encode_prompts(tok, texts, max_length, 0.5)
    order = np.argsort([len(x) for x in ids], kind="stable")
    out = np.zeros((len(texts), model.config.hidden_size), np.float32)
    bf16 = cpu_has_native_bf16()
    t0 = time.perf_counter()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            input_ids, mask = pad_batch([ids[r] for r in rows], tok.pad_token_id or 0)
            hidden = model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
            m = mask[:, :, None].float()
            out[rows] = F.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1.0), dim=-1).numpy()
            if (start // batch_size) % 50 == 0:
                print(
                    f"answer embeddings: {start + len(rows)}/{len(order)} ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    return out


def reader_target_vectors(features: np.ndarray, dim: int) -> tuple[np.ndarray, float]:
    """(decoder features standardised, projected on their top `dim` principal components (fitted on
    these prompts) and L2-normalised for the cosine term; the share of the variance those keep)."""
    from sklearn.decomposition import PCA

    if not 1 <= dim <= min(features.shape):
        raise ValueError(f"--target-dim {dim}: expected 1..{min(features.shape)} (prompts and features held)")
    x = (features - features.mean(0)) / (features.std(0) + 1e-6)
    pca = PCA(n_components=dim, svd_solver="randomized", random_state=0).fit(x)
    z = pca.transform(x).astype(np.float32)
    share = float(pca.explained_variance_ratio_.sum())
    print(f"reader targets: {dim} components keep {share:.0%} of the variance", flush=True)
    return z / np.linalg.norm(z, axis=1, keepdims=True).clip(min=1e-6), share


def aux_module(targets: dict[str, np.ndarray], weight: float):
    """pipeline.ranking.lightning.RankerModule plus the auxiliary term: weight x the cosine distance of
    the mapped pooled vector to each prompt's target vector (the answer's embedding or the reader's
    features)."""

    class AuxTargetRanker(RANKER):
        def __init__(self, model, method, **kwargs):
            super().__init__(model, method, **kwargs)
            dim = len(next(iter(targets.values())))
            self.aux_head = torch.nn.Linear(model.encoder.config.hidden_size, dim)
            self._pooled: list[torch.Tensor] = []
            self._target: torch.Tensor | None = None
            self._has: torch.Tensor | None = None
            model.head.register_forward_pre_hook(self._keep_pooled)

        def _keep_pooled(self, head, inputs):
            if self.model.training:
                self._pooled.append(inputs[0])

        def on_fit_start(self) -> None:
            ids = self.trainer.datamodule.train_table.ids
            dim = self.aux_head.out_features
            self._target = torch.as_tensor(np.stack([targets.get(p, np.zeros(dim, np.float32)) for p in ids]))
            self._has = torch.as_tensor([p in targets for p in ids])
            print(f"reply targets: {int(self._has.sum())} of {len(ids)} train prompts have one", flush=True)

        def configure_optimizers(self):
            out = super().configure_optimizers()
            opt, factor = out["optimizer"], out["lr_scheduler"]["scheduler"].lr_lambdas[0]
            opt.add_param_group({"params": list(self.aux_head.parameters()), "weight_decay": 0.0})
            # the same warm-up and decay for the new group
            out["lr_scheduler"]["scheduler"] = torch.optim.lr_scheduler.LambdaLR(opt, factor)
            return out

        def training_step(self, batch, batch_idx):
            self._pooled = []
            loss = super().training_step(batch, batch_idx)
            pooled = torch.cat(self._pooled).float()
            index = batch["index"].cpu()
            has = self._has[index]
            if has.any():
                pred = self.aux_head(pooled[has.to(pooled.device)])
                aux = (1 - F.cosine_similarity(pred.float(), self._target[index[has]].to(pred.device), dim=-1)).mean()
                self.log("train/aux_target", aux, on_step=True, on_epoch=True, batch_size=int(has.sum()))
                loss = loss + weight * aux
            return loss

    return AuxTargetRanker


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="chatgpt")
    ap.add_argument(
        "--target",
        choices=("answer", "decoder"),
        default="answer",
        help="what the pooled vector predicts: the answer's sentence embedding, or the prompt's decoder features "
        "(the reader flags --decoder, --layers, --max-length, --features-cache and --target-dim apply to decoder only)",
    )
    add_reader_flags(ap, layers="8,10,12,14,16")
    ap.add_argument("--target-dim", type=int, default=256, help="principal components kept of the decoder features")
    ap.add_argument(
        "--weights", type=comma_numbers(float), default="0.5,2", help="comma-separated weights of the auxiliary term"
    )
    ap.add_argument("--params", default=None, help=PARAMS_HELP)
    ap.add_argument(
        "--max-answers", type=int, default=None, help="use only this many train prompts' targets (a quick check)"
    )
    ap.add_argument("--work", default="/tmp/reply_targets", help="scratch root for the runs' models and metrics")
    ap.add_argument(
        "--out",
        default=None,
        help="default metrics/choices/{reply,reader}_targets-<model>-pairwise.json (--target answer, decoder)",
    )
    args = ap.parse_args(argv)
    weights = args.weights

    import pipeline.train as train_stage

    params = load_params("train", args.params)
    if args.target_dim < 1:
        ap.error("--target-dim must be >= 1")
    prompts = pd.read_parquet(prompts_path(args.data)).drop_duplicates("prompt_id").set_index("prompt_id")
    gens = pd.read_parquet(generations_path(args.model, args.data))
    train_ids = set(prompts.index[prompts.split == "train"])
    answers = gens[gens.prompt_id.isin(train_ids)].drop_duplicates("prompt_id")  # one answer per prompt
    answers = answers.head(args.max_answers) if args.max_answers else answers
    t0 = time.perf_counter()
    variance_kept = None
    if args.target == "answer":
        emb = answer_embeddings(answers.text.fillna("").tolist(), params["encoder"], int(params["max_length"]))
    else:
        ids = answers.prompt_id.tolist()
        layers, texts = sorted(set(args.layers)), prompts.loc[ids, "prompt"].tolist()
        x, _, _, where = features_of(args.decoder, layers, args.max_length, 16, ids, texts, args.features_cache)
        print(f"reader targets: features from {where}", flush=True)
        emb, variance_kept = reader_target_vectors(x, args.target_dim)
    embed_s = time.perf_counter() - t0
    targets = dict(zip(answers.prompt_id, emb))
    print(f"reply_targets: {len(targets)} train {args.target} targets in {embed_s:.0f} s", flush=True)

    committed = json.loads(Path(f"metrics/train/{args.model}-pairwise.json").read_text())
    runs = {}
    for weight in weights:
        work = Path(args.work) / f"w{weight:g}"
        ranking_lightning.RankerModule = aux_module(targets, weight)  # what train_one builds
        t0 = time.perf_counter()
        (res,) = train_stage.train_methods(
            args.model,
            ["pairwise"],
            params,
            data_root=args.data,
            models_root=work / "models",
            metrics_dir=work / "metrics",
            plots_dir=work / "plots",
        )
        curve = (work / "plots" / f"{args.model}-pairwise.csv").read_text()
        runs[f"weight {weight:g}"] = {
            "val_tau_b": round(res["val_tau_b"], 4),
            "best_epoch": res["best_epoch"],
            "train_seconds": round(time.perf_counter() - t0, 1),
            "curve_csv": curve,
        }
        print(f"reply_targets: weight {weight:g}: val tau_b {res['val_tau_b']:.4f}", flush=True)
    out = write_json(
        {
            "question": QUESTIONS[args.target],
            "target": args.target,
            **(
                {
                    "reader": {
                        "decoder": args.decoder,
                        "layers": sorted(set(args.layers)),
                        "max_length": args.max_length,
                        "components": args.target_dim,
                        "variance_kept": round(variance_kept, 4),
                    }
                }
                if args.target == "decoder"
                else {}
            ),
            "model": args.model,
            "method": "pairwise",
            "split": "val",
            "command": "python benchmarks/reply_targets.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "train_prompts_with_a_target": len(targets),
            "embed_seconds": round(embed_s, 1),
            "committed_predictor": {
                "val_tau_b": round(committed["val_tau_b"], 4),
                "best_epoch": committed["best_epoch"],
                "file": f"metrics/train/{args.model}-pairwise.json",
            },
            "runs": runs,
        },
        args.out
        or f"metrics/choices/{'reply' if args.target == 'answer' else 'reader'}_targets-{args.model}-pairwise.json",
    )
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
