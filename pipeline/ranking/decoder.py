"""A frozen causal LM's view of the prompt as a length regression: hidden states + ridge.

The ranker's encoder (MiniLM-L6 by default) and a small instruction-tuned decoder (the packaged
SmolLM2-135M-Instruct) read a prompt differently; a ridge regression of log(1 + answer tokens) on the
decoder's hidden states, added to a predictor's score with a weight chosen on val (the `blend` stage,
`blend.features: decoder`), ranks better than either (`benchmarks/decoder_features.py`,
metrics/choices/decoder_features-chatgpt*.json).

Features of one prompt: the prompt cut to `max_length` tokens (head + tail, half each), wrapped in
the decoder's chat template with the generation prompt (the position where the answer would start);
for each layer read, the hidden state at the last position and the mean over the prompt. Only the
layers up to the deepest one read (plus one, so that it is not the final norm's output) are kept
and run. The template's shared prefix (system turn and user header) is run once and its keys and
values reused by every batch (prefix caching). Saved inside a checkpoint as plain files, no
pickle: `decoder/` holds the truncated decoder (config, safetensors weights in bfloat16) and its
tokenizer; `decoder/ridge.safetensors` the standardisation and ridge coefficients, or
`decoder/pairwise_head.safetensors` those of a pairwise head (`DecoderMLPHead`: small MLPs trained
with PARS's pairwise loss on the same features).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

SUBDIR = "decoder"  # inside a checkpoint
RIDGE_FILE = "ridge.safetensors"
PAIRWISE_HEAD_FILE = "pairwise_head.safetensors"


def cut_ids(ids: list[int], max_length: int) -> list[int]:
    """Head + tail, half each: long chat prompts often ask their question after pasted text."""
    if len(ids) <= max_length:
        return ids
    head = max_length // 2
    return ids[:head] + ids[len(ids) - (max_length - head) :]


def compute_dtype(device: str = "cpu"):
    """bfloat16 where it is native (CUDA, AVX512-BF16 / AMX CPUs), else float32 (emulated bf16 is slow)."""
    import torch

    from pipeline.hardware import cpu_has_native_bf16

    if torch.device(device).type == "cuda" or cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32


class DecoderFeatures:
    """Hidden-state features of prompts under a frozen causal LM (see the module doc)."""

    def __init__(self, tokenizer, model, layers: Sequence[int], max_length: int, device: str = "cpu"):
        layers = sorted({int(k) for k in layers})
        if not layers or layers[0] < 1 or layers[-1] >= len(model.layers):
            raise ValueError(f"decoder layers {layers}: expected layer numbers in 1..{len(model.layers) - 1}")
        if int(max_length) < 8:
            raise ValueError(f"decoder max_length {max_length}: expected >= 8 tokens")
        self.tokenizer, self.model = tokenizer, model.eval().to(device)
        self.layers, self.max_length, self.device = layers, int(max_length), device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._shared_prefix: list[int] | None = None
        self._prefix_run = None  # (prefix ids, its cache and hidden-state sums): computed once, reused by every call

    @classmethod
    def load(cls, path: str | Path, layers: Sequence[int], max_length: int, device: str = "cpu") -> "DecoderFeatures":
        """The base model of the causal LM at `path` (a Hugging Face directory), cut after the
        deepest layer read + 1."""
        import torch
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"decoder {path}: its tokenizer has no chat template")
        # weights rounded to bfloat16 first, as `save` stores them: the decoder a blend is fitted with
        # computes exactly as the one its checkpoint serves
        model = AutoModel.from_pretrained(path, dtype=torch.bfloat16).to(compute_dtype(device))
        # the layers are cut and read as `model.layers` (Llama, Qwen, Mistral, SmolLM2); others (GPT-2's
        # `.h`, ...) would fail later on an AttributeError
        if not isinstance(getattr(model, "layers", None), torch.nn.ModuleList):
            raise ValueError(
                f"decoder {path}: a {type(model).__name__} keeps no `.layers` list of decoder layers "
                f"(expected a Llama-style causal LM such as SmolLM2)"
            )
        keep = max(int(k) for k in layers) + 1
        if keep > len(model.layers):
            raise ValueError(f"decoder {path} has {len(model.layers)} layers; layers {list(layers)} read past them")
        model.layers = model.layers[:keep]
        model.config.num_hidden_layers = keep
        if isinstance(getattr(model.config, "layer_types", None), list):  # Qwen2's per-layer attention kinds
            model.config.layer_types = model.config.layer_types[:keep]  # must match num_hidden_layers to save
        return cls(tokenizer, model, layers, max_length, device)

    @property
    def width(self) -> int:
        return 2 * len(self.layers) * int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        tok = self.tokenizer
        out = []
        for text in texts:
            cut = tok.decode(cut_ids(tok(text, add_special_tokens=False)["input_ids"], self.max_length))
            chat = tok.apply_chat_template(
                [{"role": "user", "content": cut}], add_generation_prompt=True, tokenize=False
            )
            out.append(tok(chat, add_special_tokens=False)["input_ids"])
        return out

    def shared_prefix(self) -> list[int]:
        """The token ids every chat-wrapped prompt starts with: the template's system turn and user
        header (24 of a ChatGPT prompt's ~75 tokens with Qwen2.5's default system message)."""
        if self._shared_prefix is None:
            a, b = self.encode(["0", "x"])
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            self._shared_prefix = a[:n]
        return self._shared_prefix

    def embed(
        self, texts: Sequence[str], batch_size: int = 16, progress: bool = False, prefix_cache: bool = True
    ) -> np.ndarray:
        """(len(texts), width) float32 features, in input order (batched by token length).

        The shared prefix is run once and its keys and values reused by every batch (prefix
        caching, as vLLM does), with its hidden states' sum added to each prompt's mean: on ChatGPT's
        prompts, 24 of about 75 tokens, and about 1.4x the prompts/s. A prompt whose first token merged
        with the template's (the prefix does not match) is read whole, as every prompt is with
        `prefix_cache=False` (benchmarks/reader_prefix_cache.py compares the two)."""
        import torch

        encoded = self.encode(list(texts))
        feats = np.zeros((len(encoded), self.width), np.float32)
        prefix = self.shared_prefix()
        cached = [prefix_cache and len(e) > len(prefix) and e[: len(prefix)] == prefix for e in encoded]
        batches = []
        for use_cache in (True, False):  # a batch shares the cache or not; similar lengths share a batch
            rows = sorted((i for i in range(len(encoded)) if cached[i] == use_cache), key=lambda i: len(encoded[i]))
            batches += [(use_cache, rows[s : s + int(batch_size)]) for s in range(0, len(rows), int(batch_size))]
        if progress:
            from tqdm import tqdm

            batches = tqdm(batches, desc="decoder features", unit="batch", mininterval=10)
        with torch.inference_mode():
            prefix_run = self._run_prefix(prefix) if any(cached) and prefix else None
            for use_cache, rows in batches:
                if use_cache and prefix_run is not None:
                    feats[rows] = self._forward([encoded[i][len(prefix) :] for i in rows], prefix_run)
                else:
                    feats[rows] = self._forward([encoded[i] for i in rows], None)
        return feats

    def _run_prefix(self, prefix: list[int]):
        """The prefix's key/value cache and, per layer read, the sum of its hidden states; kept between
        calls (the scheduler's scorer reads a few prompts per call)."""
        import torch

        if self._prefix_run is None or self._prefix_run[0] != prefix:
            out = self.model(
                input_ids=torch.tensor([prefix], device=self.device), use_cache=True, output_hidden_states=True
            )
            sums = {k: out.hidden_states[k][0].float().sum(0) for k in self.layers}
            self._prefix_run = (list(prefix), (out.past_key_values, sums, len(prefix)))
        return self._prefix_run[1]

    def _forward(self, seqs: list[list[int]], prefix_run) -> np.ndarray:
        """Features of one batch of token sequences (after the cached prefix, if `prefix_run`)."""
        import copy

        import torch

        span = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), span), self.pad_id)
        mask = torch.zeros((len(seqs), span), dtype=torch.long)
        for j, s in enumerate(seqs):  # left padding: the last position is the prompt's last token
            ids[j, span - len(s) :] = torch.tensor(s)
            mask[j, span - len(s) :] = 1
        # positions count from each prompt's first real token, as if it were alone: in bfloat16 a
        # shifted rotary angle rounds differently, and a prompt's features would depend on its
        # batch-mates' lengths
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        weight = mask.to(self.device).unsqueeze(-1).float()
        past, sums, n_prefix = None, None, 0
        if prefix_run is not None:
            cache, sums, n_prefix = prefix_run
            past = copy.deepcopy(cache)
            past.batch_repeat_interleave(len(seqs))
            positions = positions + n_prefix
            mask = torch.cat([torch.ones((len(seqs), n_prefix), dtype=torch.long), mask], 1)
        hidden = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=past,
            use_cache=past is not None,
            output_hidden_states=True,
        ).hidden_states
        parts = []
        for k in self.layers:
            h = hidden[k].float()
            total, count = (h * weight).sum(1), weight.sum(1)
            if sums is not None:  # the mean is over the whole prompt, prefix included
                total, count = total + sums[k], count + n_prefix
            parts += [h[:, -1], total / count]
        return torch.cat(parts, 1).cpu().numpy()

    def save(self, out_dir: str | Path) -> None:
        """The truncated decoder (bfloat16 weights) and its tokenizer, into `out_dir`."""
        import copy

        import torch

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        copy.deepcopy(self.model).to("cpu", torch.bfloat16).save_pretrained(out, safe_serialization=True)
        self.tokenizer.save_pretrained(out)


class DecoderRidge:
    """Standardised ridge regression of log1p(answer length) on decoder features; higher = longer."""

    def __init__(self, mean: np.ndarray, scale: np.ndarray, coef: np.ndarray, intercept: float):
        self.mean, self.scale = np.asarray(mean, np.float64), np.asarray(scale, np.float64)
        self.coef, self.intercept = np.asarray(coef, np.float64), float(intercept)

    @classmethod
    def fit_grid(cls, features: np.ndarray, lengths: Sequence[float], alphas: Sequence[float]) -> list["DecoderRidge"]:
        """One fit per alpha on the same standardisation."""
        from sklearn.linear_model import Ridge

        x = np.asarray(features, np.float64)
        mean = x.mean(0)
        scale = x.std(0)
        scale[scale == 0] = 1.0
        z = (x - mean) / scale
        y = np.log1p(np.asarray(lengths, dtype=float))
        return [cls(mean, scale, r.coef_, r.intercept_) for r in (Ridge(alpha=float(a)).fit(z, y) for a in alphas)]

    @property
    def n_features(self) -> int:
        return int(self.coef.shape[0])

    def predict(self, features: np.ndarray) -> np.ndarray:
        return ((np.asarray(features, np.float64) - self.mean) / self.scale) @ self.coef + self.intercept

    def save(self, path: str | Path) -> None:
        from safetensors.numpy import save_file

        save_file(
            {
                "mean": self.mean,
                "scale": self.scale,
                "coef": self.coef,
                "intercept": np.array([self.intercept]),
            },
            str(path),
        )

    @classmethod
    def load(cls, path: str | Path) -> "DecoderRidge":
        from safetensors.numpy import load_file

        try:
            t = load_file(str(path))
            model = cls(t["mean"], t["scale"], t["coef"], float(t["intercept"][0]))
        except Exception as exc:  # missing tensor, bad header, truncated file
            raise ValueError(f"{path}: decoder ridge could not be read ({exc})") from exc
        if not (model.mean.shape == model.scale.shape == model.coef.shape) or model.coef.ndim != 1:
            raise ValueError(f"{path}: decoder ridge tensors have mismatched shapes")
        return model


def fit_one_cycle(net, n_rows: int, batch_loss, *, epochs: int, lr: float, batch_size: int):
    """Train `net` by AdamW (weight decay 0.01) under a one-cycle learning rate peaking at `lr`, over
    `n_rows` rows in batches drawn afresh each epoch; `batch_loss(rows)` gives a batch's loss (rows: a
    LongTensor of row numbers). Returns the net, in train mode."""
    import torch

    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * math.ceil(n_rows / batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=steps, pct_start=0.1)
    net.train()
    for _ in range(epochs):
        for rows in torch.randperm(n_rows).split(batch_size):
            loss = batch_loss(rows)
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
    return net


def train_mlp(z, batch_loss, *, out_dim: int = 1, epochs: int, hidden: int, lr: float, batch_size: int, seed: int):
    """One MLP of a decoder head (dropout 0.2, Linear, GELU, dropout 0.5, Linear to `out_dim`) on the
    standardised features `z` (a float32 tensor), trained by `fit_one_cycle`; `batch_loss(outputs, rows)`
    gives a batch's loss. Returns the net, in train mode."""
    import torch

    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Dropout(0.2),
        torch.nn.Linear(z.shape[1], hidden),
        torch.nn.GELU(),
        torch.nn.Dropout(0.5),
        torch.nn.Linear(hidden, out_dim),
    )
    return fit_one_cycle(
        net, len(z), lambda rows: batch_loss(net(z[rows]), rows), epochs=epochs, lr=lr, batch_size=batch_size
    )


class DecoderMLPHead:
    """The mean of `seeds` small MLPs (dropout, one GELU hidden layer) on standardised decoder
    features, each trained with one of the pipeline's losses (`pipeline.ranking.losses`; the blend's
    is PARS's pairwise loss with the graded margin, in-batch pairs kept by δ and the censoring rules
    of `in_batch_pairs`) under a one-cycle learning rate; higher = longer. Several seeds, because one
    MLP's val tau_b moves by about 0.02 with its seed (metrics/choices/decoder_head-qwen-chatgpt.json)."""

    PARTS = ("w1", "b1", "w2", "b2")

    def __init__(
        self, mean: np.ndarray, scale: np.ndarray, nets: Sequence[dict[str, np.ndarray]], loss: str = "pairwise"
    ):
        self.mean, self.scale = np.asarray(mean, np.float32), np.asarray(scale, np.float32)
        self.nets = [{k: np.asarray(net[k], np.float32) for k in self.PARTS} for net in nets]
        self.loss = loss  # what the MLPs were trained with (a checkpoint holds pairwise heads only)

    @property
    def n_features(self) -> int:
        return int(self.mean.shape[0])

    @classmethod
    def fit(
        cls,
        features: np.ndarray,
        lengths: Sequence[float],
        truncated: Sequence[bool] | None = None,
        *,
        loss: str = "pairwise",
        seeds: int,
        epochs: int,
        hidden: int,
        lr: float,
        batch_size: int,
        delta: float,
        margin: float,
        margin_per_log_length: float,
        seed: int = 0,
        progress: bool = False,
    ) -> "DecoderMLPHead":
        """The settings are params.yaml's `blend.decoder.pairwise_head` (their one home; the blend's
        `pairwise_head_settings` reads them). `delta` picks the pairs and the margins apply with
        `loss` pairwise only."""
        import torch

        from pipeline.ranking.labels import in_batch_pairs
        from pipeline.ranking.losses import LOSSES

        if loss not in LOSSES:
            raise ValueError(f"decoder head loss {loss!r}: expected one of {sorted(LOSSES)}")
        margins = {"margin": margin, "margin_per_log_length": margin_per_log_length} if loss == "pairwise" else {}

        x = np.asarray(features, np.float32)
        mean, scale = x.mean(0), x.std(0)
        scale[scale == 0] = 1.0
        z = torch.from_numpy((x - mean) / scale)
        y = np.asarray(lengths, dtype=float)
        cut = np.zeros(len(y), bool) if truncated is None else np.asarray(truncated, bool)

        def batch_loss(out, rows):
            r = rows.numpy()
            pairs = torch.from_numpy(in_batch_pairs(y[r], cut[r], delta))
            return LOSSES[loss](out.squeeze(1), torch.from_numpy(y[r]), pairs, torch.from_numpy(cut[r]), **margins)

        nets = []
        for k in range(seeds):
            net = train_mlp(z, batch_loss, epochs=epochs, hidden=hidden, lr=lr, batch_size=batch_size, seed=seed + k)
            w1, b1, w2, b2 = (
                p.detach().numpy().copy() for p in (net[1].weight, net[1].bias, net[4].weight, net[4].bias)
            )
            nets.append({"w1": w1, "b1": b1, "w2": w2, "b2": b2})
            if progress:
                print(f"{loss} head: {k + 1}/{seeds} trained ({len(y)} prompts, {epochs} epochs)", flush=True)
        return cls(mean, scale, nets, loss)

    def predict(self, features: np.ndarray) -> np.ndarray:
        import torch

        z = torch.from_numpy((np.asarray(features, np.float32) - self.mean) / self.scale)
        out = torch.zeros(len(z), dtype=torch.float64)
        for net in self.nets:  # eval: dropout off
            h = torch.nn.functional.gelu(z @ torch.from_numpy(net["w1"]).T + torch.from_numpy(net["b1"]))
            out += (h @ torch.from_numpy(net["w2"]).T + torch.from_numpy(net["b2"])).squeeze(1).double()
        return (out / len(self.nets)).numpy()

    def save(self, path: str | Path) -> None:
        from safetensors.numpy import save_file

        tensors = {"mean": self.mean, "scale": self.scale}
        for k, net in enumerate(self.nets):
            tensors.update({f"{part}.{k}": net[part] for part in self.PARTS})
        save_file(tensors, str(path))

    @classmethod
    def load(cls, path: str | Path) -> "DecoderMLPHead":
        from safetensors.numpy import load_file

        try:
            t = load_file(str(path))
            n = len([name for name in t if name.startswith("w1.")])
            model = cls(t["mean"], t["scale"], [{p: t[f"{p}.{k}"] for p in cls.PARTS} for k in range(n)])
        except Exception as exc:  # missing tensor, bad header, truncated file
            raise ValueError(f"{path}: decoder pairwise head could not be read ({exc})") from exc
        width = model.n_features
        if (
            not model.nets
            or model.scale.shape != (width,)
            or any(net["w1"].shape[1] != width or net["w2"].shape != (1, net["w1"].shape[0]) for net in model.nets)
        ):
            raise ValueError(f"{path}: decoder pairwise head tensors have mismatched shapes")
        return model


# a checkpoint's decoder head: its kind -> (class, file in decoder/); an MLP head's kind is its loss
HEADS = {"ridge": (DecoderRidge, RIDGE_FILE), "pairwise": (DecoderMLPHead, PAIRWISE_HEAD_FILE)}


class DecoderPrior:
    """Decoder features + a head (ridge or pairwise): `predict(texts)` -> its length score."""

    def __init__(self, features: DecoderFeatures, head, batch_size: int = 16):
        if isinstance(head, DecoderMLPHead) and head.loss != "pairwise":
            raise ValueError(
                f"decoder head trained with the {head.loss} loss: a checkpoint takes a ridge or a pairwise head"
            )
        if head.n_features != features.width:
            raise ValueError(f"decoder head reads {head.n_features} features; the decoder gives {features.width}")
        self.features, self.head, self.batch_size = features, head, int(batch_size)

    @property
    def head_kind(self) -> str:
        return "ridge" if isinstance(self.head, DecoderRidge) else self.head.loss

    def predict(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros(0)
        return self.head.predict(self.features.embed(texts, self.batch_size, progress))

    def save(self, checkpoint_dir: str | Path) -> list[str]:
        """Write `decoder/` into a checkpoint; returns its files, relative to the checkpoint."""
        root = Path(checkpoint_dir)
        sub = root / SUBDIR
        self.features.save(sub)
        self.head.save(sub / HEADS[self.head_kind][1])
        return sorted(f.relative_to(root).as_posix() for f in sub.rglob("*") if f.is_file())

    @classmethod
    def load(
        cls,
        checkpoint_dir: str | Path,
        layers: Sequence[int],
        max_length: int,
        device: str = "cpu",
        head: str = "ridge",
    ) -> "DecoderPrior":
        if head not in HEADS:
            raise ValueError(f"decoder head {head!r}: expected one of {sorted(HEADS)}")
        sub = Path(checkpoint_dir) / SUBDIR
        head_cls, filename = HEADS[head]
        return cls(DecoderFeatures.load(sub, layers, max_length, device), head_cls.load(sub / filename))
