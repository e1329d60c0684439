"""Lightning training of a LengthRanker: the LightningModule (loss, optimiser, validation metrics)
and the callback that keeps the best epoch's weights by val Kendall tau_b.

The plain model stays a plain nn.Module (pipeline.ranking.model); export and serving never import
this file.
"""

from __future__ import annotations

import copy
import math
import time
from functools import partial
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from pipeline.ranking.losses import LOSSES
from pipeline.ranking.metrics import kendall_tau_b, pair_accuracy


def prepare_for_training(model, method: str, train_lengths, train_prior=None) -> None:
    """Freeze the encoder's pooler: the score reads the [CLS] hidden state, so the pooler gets no
    gradient, and DDP refuses parameters that take no part in the loss. (It stays in the state dict,
    so checkpoints keep the encoder's usual layout.)

    Pointwise regresses onto log(1 + length) (about 5-7): start the head's bias at the mean target
    (less the lexical prior, when the score adds one), so the steps learn the ranking instead of
    just the offset."""
    pooler = getattr(model.encoder, "pooler", None)
    if isinstance(pooler, torch.nn.Module):
        pooler.requires_grad_(False)
    if method == "pointwise" and len(train_lengths):
        with torch.no_grad():
            target = np.log1p(np.asarray(train_lengths, np.float64))
            if train_prior is not None:
                target = target - np.asarray(train_prior, np.float64)
            model.head.bias.fill_(float(np.mean(target)))


class RankerModule(L.LightningModule):
    """Holds the plain LengthRanker; `method` picks the loss; logs val tau_b and pair accuracy."""

    def __init__(
        self,
        model: torch.nn.Module,
        method: str,
        *,
        lr: float = 2e-5,
        weight_decay: float = 0.01,
        warmup_fraction: float = 0.1,
        margin: float = 1.0,
        margin_per_log_length: float = 0.0,
        val_pairs: np.ndarray | None = None,
        frozen_layers: int = 0,
        val_groups: np.ndarray | None = None,
    ):
        super().__init__()
        if method not in LOSSES:
            raise ValueError(f"unknown method {method!r}; expected one of {sorted(LOSSES)}")
        self.model = model
        self.method = method
        self.loss_fn = (
            partial(LOSSES[method], margin=margin, margin_per_log_length=margin_per_log_length)
            if method == "pairwise"
            else LOSSES[method]
        )
        self.save_hyperparameters(ignore=["model", "val_pairs", "val_groups"])
        self.val_pairs = np.zeros((0, 2), np.int64) if val_pairs is None else np.asarray(val_pairs, np.int64)
        # batches carry the cached output of the frozen layers ("hidden") when frozen_layers > 0
        self.frozen_layers = int(frozen_layers)
        # cross-model sets: val tau_b is the mean of each model's own tau_b (lengths of different
        # models are not on one scale)
        self.val_groups = None if val_groups is None else np.asarray(val_groups, np.int64)
        self._val_parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.last_val: dict[str, float] = {}
        # Throughput counters (training steps only; validation and data loading excluded).
        self.prompts_encoded = 0
        self.pairs_seen = 0
        self.train_seconds = 0.0
        self._t0 = 0.0
        self._epoch_loss = [0.0, 0]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask)

    # -- training -------------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        self._epoch_loss = [0.0, 0]
        # Lightning calls set_epoch on a loader's sampler only, never on a batch sampler of its own
        # (LengthBucketBatches): without this every epoch would replay the first epoch's batches
        batches = getattr(self.trainer.train_dataloader, "batch_sampler", None)
        if callable(getattr(batches, "set_epoch", None)):
            batches.set_epoch(self.current_epoch)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._t0 = time.perf_counter()

    def batch_scores(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The encoder's scores, plus the batch's lexical prior when it carries one: the encoder
        then learns what the prior misses (serving adds the same prior: `attach_lexical`)."""
        parts = batch.get("parts", [batch])  # micro-batches padded apart, scored as one batch
        scores = torch.cat([self._part_scores(part) for part in parts])
        if "prior" in batch:
            scores = scores + batch["prior"].to(scores.device, scores.dtype)
        return scores

    def _part_scores(self, part: dict[str, torch.Tensor]) -> torch.Tensor:
        if "hidden" in part:
            return self.model.score_from(part["hidden"], part["attention_mask"], self.frozen_layers).float()
        return self(part["input_ids"], part["attention_mask"]).float()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        scores = self.batch_scores(batch)
        loss = self.loss_fn(scores, batch["lengths"].to(scores.dtype), batch["pairs"], batch.get("truncated"))
        n, m = int(batch["lengths"].shape[0]), int(batch["pairs"].shape[0])
        self.prompts_encoded += n
        self.pairs_seen += m if self.method == "pairwise" else 0
        self._epoch_loss[0] += float(loss.detach()) * n
        self._epoch_loss[1] += n
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=n)
        if self.method == "pairwise":
            self.log("train/pairs_per_step", float(m), on_step=True, on_epoch=False, batch_size=n)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.train_seconds += time.perf_counter() - self._t0

    def on_train_end(self) -> None:
        # Under DDP each rank counted its own shard (in-batch pair counts differ between ranks):
        # sum them, so the reported throughput is the whole job's.
        if self.trainer.world_size > 1:
            counts = torch.tensor([self.prompts_encoded, self.pairs_seen], dtype=torch.float64, device=self.device)
            counts = self.trainer.strategy.reduce(counts, reduce_op="sum")
            self.prompts_encoded, self.pairs_seen = (int(round(float(x))) for x in counts.cpu())

    @property
    def epoch_train_loss(self) -> float:
        total, n = self._epoch_loss
        return total / n if n else float("nan")

    def configure_optimizers(self):
        # No weight decay on biases and LayerNorm weights (the usual BERT fine-tuning practice).
        decay = [p for p in self.model.parameters() if p.requires_grad and p.ndim >= 2]
        rest = [p for p in self.model.parameters() if p.requires_grad and p.ndim < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.hparams.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=self.hparams.lr,
            fused=self._fused_adamw(decay + rest),
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warm = math.ceil(self.hparams.warmup_fraction * total)

        def factor(step: int) -> float:  # linear warm-up, then linear decay to 0
            if step < warm:
                return (step + 1) / warm
            return max(0.0, (total - step) / max(1, total - warm))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def _fused_adamw(self, params: list[torch.nn.Parameter]) -> bool:
        """torch's fused AdamW updates every parameter in one kernel instead of a loop over them (a
        CPU step of the default training: optimizer 32-38 -> 7-9 ms, benchmarks/train_throughput.py).
        It unscales fp16 gradients itself, so not under a GradScaler (16-mixed), where Lightning must
        unscale them before clipping."""
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        return scaler is None and bool(params) and all(p.device.type in ("cpu", "cuda") for p in params)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        # Lightning refuses to clip for an optimizer that could unscale gradients itself (a fused one);
        # without a GradScaler (the only case that uses fused) the gradients are already the true ones
        fused = bool(getattr(optimizer, "defaults", {}).get("fused"))
        if fused and gradient_clip_val and gradient_clip_algorithm in (None, "norm"):
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, float(gradient_clip_val))
        else:
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    # -- validation -----------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val_parts = []
        # val scores as a scorer computes them (head in float32 under bf16 autocast): the best epoch
        # is chosen on the scores the exported model gives, not on ~3-digit bfloat16 ones
        self.model.head_in_float32 = True

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        scores = self.batch_scores(batch)
        self._val_parts.append((batch["index"], scores.detach(), batch["lengths"].to(scores.device)))

    def on_validation_epoch_end(self) -> None:
        self.model.head_in_float32 = False  # training keeps the head in bf16-mixed's dtype
        if not self._val_parts:
            return
        idx = torch.cat([p[0] for p in self._val_parts])
        scores = torch.cat([p[1] for p in self._val_parts])
        lengths = torch.cat([p[2] for p in self._val_parts]).double()
        if self.trainer.world_size > 1:
            # Each rank scored a shard (padded by repeats): gather all, then keep one score per prompt.
            idx, scores, lengths = (self.all_gather(t).reshape(-1) for t in (idx, scores, lengths))
        idx, scores, lengths = idx.cpu().numpy(), scores.cpu().numpy(), lengths.cpu().numpy()
        n = int(idx.max()) + 1
        s_full, l_full = np.zeros(n), np.zeros(n)
        s_full[idx], l_full[idx] = scores, lengths
        seen = np.unique(idx)
        if self.val_groups is None:
            tau = kendall_tau_b(s_full[seen], l_full[seen])
        else:
            g = self.val_groups[seen]
            per_group = [kendall_tau_b(s_full[seen][g == k], l_full[seen][g == k]) for k in np.unique(g)]
            defined = [t for t in per_group if np.isfinite(t)]
            tau = float(np.mean(defined)) if defined else float("nan")
        ok = np.isin(self.val_pairs, seen).all(axis=1) if len(self.val_pairs) else np.zeros(0, bool)
        acc = pair_accuracy(s_full, l_full, self.val_pairs[ok])
        self.last_val = {"val_tau_b": tau, "val_pair_acc": acc, "n_val_prompts": int(len(seen))}
        # Every rank holds the same gathered values, so no sync_dist reduction is needed.
        if self.trainer.is_global_zero and not self.trainer.sanity_checking:
            # one line per epoch: Lightning's bar is not drawn when the output is not a terminal (dvc repro)
            rate = self.prompts_encoded / self.train_seconds if self.train_seconds else 0.0
            print(
                f"epoch {self.current_epoch}: val tau_b {tau:.4f}, pair acc {acc:.4f} "
                f"({self.prompts_encoded} prompts trained, {rate:.1f} prompts/s)",
                flush=True,
            )
        self.log("val/tau_b", tau, prog_bar=True)
        if self.train_seconds:  # the training rate so far, beside each epoch's val figures
            self.log("train/prompts_per_s", self.prompts_encoded / self.train_seconds)
        if np.isfinite(acc):
            self.log("val/pair_acc", acc, prog_bar=True)


class BestWeights(Callback):
    """Keeps (in memory) the plain model's weights of the epoch with the best val tau_b, and a
    per-epoch history. `on_validation_end` runs after the module logged the epoch's metrics."""

    def __init__(self):
        self.best_tau = -math.inf
        self.best_epoch: int | None = None
        self.best_val: dict[str, float] = {}
        self.state: dict[str, torch.Tensor] | None = None
        self.history: list[dict[str, float]] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: RankerModule) -> None:
        if trainer.sanity_checking or not pl_module.last_val:
            return
        row = {"epoch": int(trainer.current_epoch), "train_loss": pl_module.epoch_train_loss, **pl_module.last_val}
        self.history.append(row)
        # an undefined tau (constant scores: no ranking at all) loses to any defined one
        tau = row["val_tau_b"] if math.isfinite(row["val_tau_b"]) else -math.inf
        if self.state is None or tau > self.best_tau:
            self.best_tau, self.best_epoch, self.best_val = tau, row["epoch"], dict(row)
            self.state = {k: v.detach().cpu().clone() for k, v in pl_module.model.state_dict().items()}

    def restore(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.state is None:
            raise RuntimeError("no validation epoch finished: there are no best weights to restore")
        model.load_state_dict(copy.deepcopy(self.state))
        return model
