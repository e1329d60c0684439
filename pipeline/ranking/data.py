"""Training data for the ranking predictors: tokenised prompt tables, batch collation and one
DataModule parametrised by method.

Batches are dicts: input_ids / attention_mask (n, T) for the n prompts encoded in the step,
lengths (n,) their label lengths, pairs (m, 2) the index pairs the pairwise loss compares, and
index (n,) the prompts' rows in their table (validation gathers scores by it). With
`micro_batches` > 1 the rows are sorted by token count and `parts` holds a list of such
input_ids (or hidden) / attention_mask dicts, each padded to its own longest prompt, in row order.

- in-batch pairwise, pointwise, listwise: a batch is `batch_size` distinct prompts; for pairwise
  every pair among them that passes the δ filter (pipeline.ranking.labels.keep_mask) is compared, each
  prompt encoded once.
- per-pair pairwise (the paper's batches): a batch is `batch_size` rows of train.parquet, both
  prompts of each pair encoded (2 * batch_size encodings).

With `frozen_layers` k > 0 the embeddings and the first k encoder layers are frozen: their output
for every prompt is computed once (`RankingDataModule.cache_hidden`) and batches carry `hidden`
(n, T, d) instead of input_ids, so each step runs only the top layers and the head. A cross-model
training set is the union of several models' labels; each prompt row carries a `group` (the model)
and in-batch pairs never compare two groups.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import lightning as L
import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from pipeline.contracts import LABELS, PAIRS, PROMPTS, labels_path, pairs_dir, prompts_path, read_json, read_table
from pipeline.errors import PARSError
from pipeline.ranking.labels import in_batch_pairs
from pipeline.ranking.losses import METHODS
from pipeline.ranking.model import encode_prompts, pad_batch, padded_width

PAIRWISE_MODES = ("in_batch", "per_pair")


@dataclass
class PromptTable:
    """The prompts of one split, tokenised once (no padding: batches pad to their own longest)."""

    ids: np.ndarray  # prompt_id strings
    input_ids: list[list[int]]
    lengths: np.ndarray  # float64 label lengths
    truncated: np.ndarray  # bool
    groups: np.ndarray | None = None  # int group (model) per row in a cross-model set, else None
    hidden: list[torch.Tensor] | None = None  # cached frozen-encoder output per row, (tokens, d)
    prior: np.ndarray | None = None  # lexical prior per row, added to the encoder's score (train's lexical_prior)

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def build(
        cls, labels: pd.DataFrame, texts: dict[str, str], tokenizer, max_length: int, head_fraction: float = 1.0
    ) -> "PromptTable":
        ids = labels["prompt_id"].to_numpy()
        enc = encode_prompts(tokenizer, [texts[p] for p in ids], max_length, head_fraction)
        groups = labels["group"].to_numpy(np.int64) if "group" in labels else None
        return cls(ids, enc, labels["length"].to_numpy(np.float64), labels["truncated"].to_numpy(bool), groups)

    def position(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.ids)}


@dataclass
class RankingData:
    """Everything train reads for one generation model: labels, pairs and prompt texts."""

    model: str
    labels: pd.DataFrame
    train_pairs: pd.DataFrame
    val_pairs: pd.DataFrame
    texts: dict[str, str]
    datasets: list[str]
    delta: float
    members: tuple[str, ...] = ()  # the generation models of a cross-model set (group i = members[i])

    @classmethod
    def load(cls, model: str, data_root: str | Path = "data") -> "RankingData":
        pdir = pairs_dir(model, data_root)
        if not pdir.is_dir():
            have = sorted(d.name for d in pdir.parent.iterdir() if d.is_dir()) if pdir.parent.is_dir() else []
            raise FileNotFoundError(
                f"no pairs for model {model!r}: {pdir} does not exist (pairs exist for: {', '.join(have) or 'none'}; "
                f"a model listed in pairs.models gets them with `dvc repro pairs@{model}`)"
            )
        labels = read_table(labels_path(model, data_root), LABELS)
        train_pairs = read_table(pdir / "train.parquet", PAIRS)
        val_pairs = read_table(pdir / "val.parquet", PAIRS)
        meta_file = pdir / "meta.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"{meta_file} is missing (re-run `dvc repro pairs@{model}`)")
        meta = read_json(meta_file)
        delta = meta.get("delta")
        # the pairs stage's own range (pairs.delta): 0 < delta < 1; -1 or 5 would keep every pair or none
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not (0 < delta < 1):
            raise PARSError(
                f"{meta_file}: delta {delta!r} must be a number between 0 and 1 (re-run `dvc repro pairs@{model}`)"
            )
        prompts = read_table(prompts_path(data_root), PROMPTS)  # read_table refuses a repeated prompt_id
        missing = ~labels["prompt_id"].isin(prompts["prompt_id"])
        if missing.any():
            raise ValueError(
                f"{labels_path(model, data_root)}: {int(missing.sum())} prompt(s) not in "
                f"{prompts_path(data_root)}; re-run the pairs stage"
            )
        # the split a prompt trains or validates in must be the one prepare gave it: a test prompt
        # relabelled train in either file would be trained on and then scored as unseen
        split_of = labels["prompt_id"].map(prompts.set_index("prompt_id")["split"])
        moved = (labels["split"] != split_of).to_numpy()
        if moved.any():
            first = labels.loc[moved].iloc[0]
            raise ValueError(
                f"{labels_path(model, data_root)}: {int(moved.sum())} prompt(s) have another split than in "
                f"{prompts_path(data_root)} (e.g. {first['prompt_id']!r}: {first['split']} here, "
                f"{split_of[moved].iloc[0]} there); re-run the pairs stage"
            )
        for split, name, frame in (("train", "train.parquet", train_pairs), ("val", "val.parquet", val_pairs)):
            _check_pair_splits(frame, labels, split, pdir / name, labels_path(model, data_root))
        used = prompts[prompts["prompt_id"].isin(labels["prompt_id"])]
        train_ids = set(labels.loc[labels["split"] == "train", "prompt_id"])
        datasets = sorted(used.loc[used["prompt_id"].isin(train_ids), "dataset"].unique().tolist())
        return cls(
            model,
            labels,
            train_pairs,
            val_pairs,
            dict(zip(used["prompt_id"], used["prompt"])),
            datasets,
            float(delta),
            (model,),
        )

    @classmethod
    def load_union(cls, name: str, models: Sequence[str], data_root: str | Path = "data") -> "RankingData":
        """The cross-model training set `name`: the labels and pairs of every model in `models`.
        A prompt answered by two models is two rows (ids become "<model>/<prompt_id>")."""
        if not models:
            raise ValueError(f"cross-model set {name!r} names no models")
        parts = [cls.load(m, data_root) for m in models]
        deltas = {p.delta for p in parts}
        if len(deltas) > 1:
            raise ValueError(
                f"cross-model set {name!r}: the pairs of {list(models)} used different deltas {sorted(deltas)}"
            )

        def key(model: str, ids: pd.Series) -> pd.Series:
            return model + "/" + ids.astype(str)

        labels, train, val, texts = [], [], [], {}
        for g, part in enumerate(parts):
            labels.append(part.labels.assign(prompt_id=key(part.model, part.labels["prompt_id"]), group=g))
            for frame, out in ((part.train_pairs, train), (part.val_pairs, val)):
                out.append(frame.assign(a=key(part.model, frame["a"]), b=key(part.model, frame["b"])))
            texts.update({f"{part.model}/{pid}": text for pid, text in part.texts.items()})
        datasets = sorted({d for p in parts for d in p.datasets})
        return cls(
            name,
            pd.concat(labels, ignore_index=True),
            pd.concat(train, ignore_index=True),
            pd.concat(val, ignore_index=True),
            texts,
            datasets,
            deltas.pop(),
            tuple(models),
        )


def _check_pair_splits(pairs: pd.DataFrame, labels: pd.DataFrame, split: str, path: Path, labels_file: Path) -> None:
    """Both prompts of every pair of `path` are labelled, in `split` (the pairs stage never crosses
    splits): a pair with a val prompt among the train pairs would leak val into training."""
    split_of = labels.set_index("prompt_id")["split"]
    a, b = pairs["a"].map(split_of), pairs["b"].map(split_of)
    bad = ((a != split) | (b != split)).to_numpy()
    if not bad.any():
        return
    row = int(np.flatnonzero(bad)[0])
    pid, found = (pairs["a"].iloc[row], a.iloc[row]) if a.iloc[row] != split else (pairs["b"].iloc[row], b.iloc[row])
    where = f"not in {labels_file}" if pd.isna(found) else f"a {found} prompt in {labels_file}"
    raise ValueError(
        f"{path}: {int(bad.sum())} {split} pair(s) cross splits or name an unlabelled prompt (e.g. row {row}: "
        f"{pid!r} is {where}); re-run the pairs stage"
    )


class _Rows(Dataset):
    """Indices 0..n-1; the collate function turns a list of them into a batch."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _pad_hidden(
    rows: Sequence[torch.Tensor], multiple: int = 1, cap: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cached hidden states (tokens_i, d) -> (n, T, d) zero-padded, and the attention mask (T as
    `padded_width` rounds it)."""
    width = padded_width(max(h.shape[0] for h in rows), multiple, cap)
    out = torch.zeros((len(rows), width, rows[0].shape[1]), dtype=rows[0].dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, h in enumerate(rows):
        out[r, : h.shape[0]] = h
        mask[r, : h.shape[0]] = 1
    return out, mask


def least_padding_parts(sizes: Sequence[int], parts: int) -> list[slice]:
    """Cut prompts sorted by size into at most `parts` contiguous groups so that the padded
    total (group size x its longest prompt) is least: dynamic programming over the cut points."""
    n, parts = len(sizes), max(1, min(int(parts), len(sizes)))
    cost = np.full((parts + 1, n + 1), np.inf)
    cut = np.zeros((parts + 1, n + 1), np.int64)
    cost[0, 0] = 0.0
    for k in range(1, parts + 1):
        for end in range(1, n + 1):
            starts = np.arange(end)
            total = cost[k - 1, :end] + (end - starts) * sizes[end - 1]
            cut[k, end] = int(np.argmin(total))
            cost[k, end] = total[cut[k, end]]
    k, end, out = int(np.argmin(cost[1:, n])) + 1, n, []
    while end > 0:
        out.append(slice(int(cut[k, end]), end))
        k, end = k - 1, int(cut[k, end])
    return out[::-1]


class LengthBucketBatches(Sampler):
    """Batches of prompts of similar token length: each epoch shuffles, cuts the order into
    chunks of `bucket` batches, sorts each chunk by length, cuts it into batches and shuffles the
    batches. Batches stay random in content but are padded far less (measured in
    benchmarks/train_throughput.py). With `groups` (a cross-model set) every batch holds prompts of
    one group, so each in-batch pair is comparable; otherwise a small model's prompts would rarely
    meet a partner of their own model in a batch dominated by the largest one. A bucket of one
    batch mixes nothing across batches: random batches (of one group each)."""

    def __init__(
        self,
        sizes: Sequence[int],
        batch_size: int,
        bucket: int = 50,
        seed: int = 42,
        groups: Sequence[int] | None = None,
    ):
        self.sizes, self.batch_size, self.bucket, self.seed = np.asarray(sizes), int(batch_size), int(bucket), int(seed)
        self.groups = np.zeros(len(self.sizes), np.int64) if groups is None else np.asarray(groups)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:  # Lightning calls it each epoch
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return sum(-(-int(n) // self.batch_size) for n in np.unique(self.groups, return_counts=True)[1])

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(len(self.sizes))
        chunk = self.batch_size * self.bucket
        batches = []
        for group in np.unique(self.groups):
            mine = order[self.groups[order] == group]
            for start in range(0, len(mine), chunk):
                part = mine[start : start + chunk]
                part = part[np.argsort(self.sizes[part], kind="stable")]
                batches += [part[i : i + self.batch_size].tolist() for i in range(0, len(part), self.batch_size)]
        for b in rng.permutation(len(batches)):
            yield batches[b]


class PromptCollate:
    """Distinct prompts -> batch; with `delta` set, every δ-valid pair among them (in-batch pairs).

    With `micro_batches` > 1 the prompts are sorted by token length and padded in up to that many
    groups ("parts", cut where they pad least): the model scores each part at its own width and the loss sees the scores of the
    whole batch, so pairs still join a 9-token prompt with a 128-token one while the padding
    approaches that of length-sorted batches (whose pairs almost never cross lengths).
    `pad_multiple` rounds each part's width up to a multiple of it, at most `max_width`
    (`padded_width`); the parts are cut on the rounded widths."""

    def __init__(
        self,
        table: PromptTable,
        pad_id: int,
        delta: float | None = None,
        micro_batches: int = 1,
        pad_multiple: int = 1,
        max_width: int | None = None,
    ):
        self.table, self.pad_id, self.delta, self.micro_batches = table, pad_id, delta, int(micro_batches)
        self.pad_multiple, self.max_width = int(pad_multiple), max_width

    def _padded(self, rows: Sequence[int]) -> dict[str, torch.Tensor]:
        if self.table.hidden is not None:
            hidden, mask = _pad_hidden([self.table.hidden[r] for r in rows], self.pad_multiple, self.max_width)
            return {"hidden": hidden, "attention_mask": mask}
        ids, mask = pad_batch([self.table.input_ids[r] for r in rows], self.pad_id, self.pad_multiple, self.max_width)
        return {"input_ids": ids, "attention_mask": mask}

    def __call__(self, rows: list[int]) -> dict[str, torch.Tensor]:
        rows_arr = np.asarray(rows, dtype=np.int64)
        if self.micro_batches > 1:
            sizes = np.array([len(self.table.input_ids[r]) for r in rows_arr])
            order = np.argsort(sizes, kind="stable")
            rows_arr, sizes = rows_arr[order], sizes[order]
        lengths = self.table.lengths[rows_arr]
        if self.delta is None:
            pairs = np.zeros((0, 2), dtype=np.int64)
        else:
            groups = None if self.table.groups is None else self.table.groups[rows_arr]
            pairs = in_batch_pairs(lengths, self.table.truncated[rows_arr], self.delta, groups)
        batch = {
            "lengths": torch.as_tensor(lengths),
            "truncated": torch.as_tensor(self.table.truncated[rows_arr]),
            "pairs": torch.as_tensor(pairs),
            "index": torch.as_tensor(rows_arr),
        }
        if self.table.prior is not None:
            batch["prior"] = torch.as_tensor(self.table.prior[rows_arr], dtype=torch.float32)
        if self.micro_batches > 1:
            widths = [padded_width(int(n), self.pad_multiple, self.max_width) for n in sizes]
            batch["parts"] = [
                self._padded(rows_arr[p].tolist()) for p in least_padding_parts(widths, self.micro_batches)
            ]
        else:
            batch.update(self._padded(rows_arr.tolist()))
        return batch


class PairCollate:
    """Rows of a pairs table -> batch encoding both prompts of each pair (the paper's batches)."""

    def __init__(
        self,
        table: PromptTable,
        a: np.ndarray,
        b: np.ndarray,
        pad_id: int,
        pad_multiple: int = 1,
        max_width: int | None = None,
    ):
        self.table, self.a, self.b, self.pad_id = table, a, b, pad_id
        self.pad_multiple, self.max_width = int(pad_multiple), max_width

    def __call__(self, rows: list[int]) -> dict[str, torch.Tensor]:
        rows_arr = np.asarray(rows, dtype=np.int64)
        members = np.concatenate([self.a[rows_arr], self.b[rows_arr]])
        ids, mask = pad_batch(
            [self.table.input_ids[r] for r in members], self.pad_id, self.pad_multiple, self.max_width
        )
        p = len(rows)
        pairs = np.stack([np.arange(p), np.arange(p) + p], axis=1)
        batch = {
            "input_ids": ids,
            "attention_mask": mask,
            "lengths": torch.as_tensor(self.table.lengths[members]),
            "truncated": torch.as_tensor(self.table.truncated[members]),
            "pairs": torch.as_tensor(pairs, dtype=torch.long),
            "index": torch.as_tensor(members),
        }
        if self.table.prior is not None:
            batch["prior"] = torch.as_tensor(self.table.prior[members], dtype=torch.float32)
        return batch


def pair_indices(pairs: pd.DataFrame, table: PromptTable, where: str) -> np.ndarray:
    """(m, 2) rows of `table` for the a/b prompt ids of a pairs table."""
    pos = table.position()
    try:
        return np.array([[pos[a], pos[b]] for a, b in zip(pairs["a"], pairs["b"])], dtype=np.int64).reshape(-1, 2)
    except KeyError as exc:  # RankingData.load checks the pairs files; this is a table built otherwise
        raise ValueError(
            f"{where}: prompt {exc.args[0]!r} is not among this split's labelled prompts (a pair that "
            f"crosses splits, or a prompt with no label in labels.parquet)"
        ) from exc


def _check_trainable(data: RankingData, method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    if len(data.members) > 1 and method == "listwise":
        raise ValueError(
            f"{data.model}: listwise ranks a batch as one list, which mixes models' length "
            f"scales in a cross-model set; train it with pairwise or pointwise"
        )


class RankingDataModule(L.LightningDataModule):
    """Train/val loaders for one (model, method). `pairwise_mode` picks in-batch or per-pair batches."""

    def __init__(
        self,
        data: RankingData,
        tokenizer,
        method: str,
        *,
        max_length: int = 64,
        batch_size: int = 16,
        eval_batch_size: int = 64,
        pairwise_mode: str = "in_batch",
        max_train_prompts: int | None = None,
        seed: int = 42,
        num_workers: int = 0,
        head_fraction: float = 1.0,
        length_buckets: int = 0,
        micro_batches: int = 1,
        pad_to_multiple_of: int = 1,
    ):
        super().__init__()
        _check_trainable(data, method)
        if pairwise_mode not in PAIRWISE_MODES:
            raise ValueError(f"train.pairwise_mode must be one of {PAIRWISE_MODES}, got {pairwise_mode!r}")
        self.data, self.tokenizer, self.method = data, tokenizer, method
        self.max_length, self.batch_size, self.eval_batch_size = max_length, batch_size, eval_batch_size
        self.pairwise_mode, self.num_workers = pairwise_mode, num_workers
        self.per_pair = method == "pairwise" and pairwise_mode == "per_pair"
        self.seed, self.length_buckets, self.micro_batches = seed, int(length_buckets), int(micro_batches)
        self.pad_to_multiple_of = int(pad_to_multiple_of)
        # the settings as given: `with_method` builds another method's loaders from them
        self._settings = {
            "max_length": max_length,
            "batch_size": batch_size,
            "eval_batch_size": eval_batch_size,
            "pairwise_mode": pairwise_mode,
            "max_train_prompts": max_train_prompts,
            "seed": seed,
            "num_workers": num_workers,
            "head_fraction": head_fraction,
            "length_buckets": length_buckets,
            "micro_batches": micro_batches,
            "pad_to_multiple_of": pad_to_multiple_of,
        }

        labels = data.labels
        train_labels = labels[labels["split"] == "train"].sort_values("prompt_id")
        val_labels = labels[labels["split"] == "val"].sort_values("prompt_id")
        if max_train_prompts and len(train_labels) > max_train_prompts:
            # A seeded subset bounds the CPU time; per-pair batches keep the pairs anchored in it.
            keep = np.random.default_rng(seed).choice(len(train_labels), max_train_prompts, replace=False)
            anchors = set(train_labels["prompt_id"].iloc[np.sort(keep)])
            tp = data.train_pairs
            if self.per_pair:  # partners may lie outside the subset; they are encoded as part of the pair
                train_pairs = tp[tp["a"].isin(anchors)]
            else:
                train_pairs = tp[tp["a"].isin(anchors) & tp["b"].isin(anchors)]
                train_labels = train_labels[train_labels["prompt_id"].isin(anchors)]
        else:
            train_pairs = data.train_pairs
        if len(train_labels) < 2 or len(val_labels) < 2:
            raise ValueError(
                f"model {data.model}: {len(train_labels)} train and {len(val_labels)} val prompts "
                f"have labels; at least 2 of each are needed"
            )
        self.train_table = PromptTable.build(train_labels, data.texts, tokenizer, max_length, head_fraction)
        self.val_table = PromptTable.build(val_labels, data.texts, tokenizer, max_length, head_fraction)
        self.train_pair_idx = pair_indices(train_pairs, self.train_table, "train.parquet")
        self.val_pair_idx = pair_indices(data.val_pairs, self.val_table, "val.parquet")
        if self.per_pair and len(self.train_pair_idx) == 0:
            raise ValueError(f"model {data.model}: no train pairs to train on")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def with_method(self, method: str) -> "RankingDataModule":
        """The loaders of another method over the same tables (token ids, lexical prior and frozen
        layers' cache shared, not copied): one stage trains every method from one setup. Per-pair
        pairwise batches draw another train subset under max_train_prompts, so they are built anew."""
        _check_trainable(self.data, method)
        if (method == "pairwise" and self.pairwise_mode == "per_pair") != self.per_pair:
            return RankingDataModule(self.data, self.tokenizer, method, **self._settings)
        other = copy.copy(self)
        L.LightningDataModule.__init__(other)  # no trainer or hook state carried over
        other.method = method
        return other

    @property
    def n_train_prompts(self) -> int:
        if self.per_pair:
            return int(len(np.unique(self.train_pair_idx)))
        return len(self.train_table)

    def describe(self) -> dict[str, Any]:
        return {
            "n_train_prompts": self.n_train_prompts,
            "n_train_pairs_file": int(len(self.train_pair_idx)),
            "n_val_prompts": len(self.val_table),
            "n_val_pairs": int(len(self.val_pair_idx)),
        }

    def fit_lexical_prior(self, *, alpha: float, ngram_max: int, min_df: int, folds: int, min_df_key: str = "min_df"):
        """Fit TF-IDF + ridge on the train prompts and set each table's `prior`: out-of-fold
        predictions on train, the full fit's on val (so val sees what serving will). Returns the
        full fit, which the checkpoint carries. A cross-model set gets one regression over the
        union, as the blend stage fits (its pairs never compare two models, so each model's
        offset does not matter)."""
        from pipeline.ranking.lexical import TfidfRidge

        texts = self.data.texts
        lexical, oof = TfidfRidge.cross_fitted(
            [texts[p] for p in self.train_table.ids],
            self.train_table.lengths,
            alpha=alpha,
            ngram_max=ngram_max,
            min_df=min_df,
            folds=folds,
            seed=self.seed,
            min_df_key=min_df_key,
        )
        self.train_table.prior = oof
        self.val_table.prior = lexical.predict([texts[p] for p in self.val_table.ids])
        return lexical

    def cache_hidden(
        self,
        model,
        n_layers: int,
        batch_size: int = 64,
        device: str | torch.device = "cpu",
        precision: str = "32-true",
    ) -> float:
        """Run the frozen lower encoder once over every train and val prompt (eval mode, no grad,
        length-sorted batches) and keep its output in host memory; returns the seconds it took.
        `device` runs it on an accelerator (the model goes back where it was). `precision` is the
        run's Lightning precision: under bf16 the frozen layers run in bfloat16 autocast, as the
        trained layers do, and the cache is kept in bfloat16 (half the memory)."""
        import time

        from tqdm.auto import tqdm

        if self.per_pair:
            raise ValueError("train.frozen_layers > 0 needs in-batch batches (pairwise_mode in_batch)")
        t0, was_training = time.perf_counter(), model.training
        home = next(model.parameters()).device
        model.eval().to(device)
        bf16 = str(precision).startswith("bf16")
        autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16)
        with torch.inference_mode(), autocast:
            for name, table in (("train", self.train_table), ("val", self.val_table)):
                order = np.argsort([len(x) for x in table.input_ids], kind="stable")
                hidden: list[torch.Tensor | None] = [None] * len(table)
                for start in tqdm(
                    range(0, len(order), batch_size), desc=f"frozen encoder ({name})", unit="batch", leave=False
                ):
                    rows = order[start : start + batch_size]
                    ids, mask = pad_batch(
                        [table.input_ids[r] for r in rows], self.pad_id, self.pad_to_multiple_of, self.max_length
                    )
                    out = model.hidden_after(ids.to(device), mask.to(device), n_layers).cpu()
                    out = out.to(torch.bfloat16 if bf16 else torch.float32)
                    for k, r in enumerate(rows):
                        hidden[r] = out[k, : len(table.input_ids[r])].clone()
                table.hidden = hidden
        model.train(was_training).to(home)
        return time.perf_counter() - t0

    @property
    def _padding(self) -> tuple[int, int]:
        """The collates' (pad_multiple, max_width): batch widths rounded up, never past max_length."""
        return self.pad_to_multiple_of, self.max_length

    def _loader(self, dataset, collate, shuffle: bool, batch_size: int) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            collate_fn=collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def _single_process(self) -> bool:
        trainer = getattr(self, "trainer", None)
        return trainer is None or int(trainer.world_size) == 1

    def train_dataloader(self) -> DataLoader:
        if self.per_pair:
            collate = PairCollate(
                self.train_table, self.train_pair_idx[:, 0], self.train_pair_idx[:, 1], self.pad_id, *self._padding
            )
            return self._loader(_Rows(len(self.train_pair_idx)), collate, True, self.batch_size)
        delta = self.data.delta if self.method == "pairwise" else None
        collate = PromptCollate(self.train_table, self.pad_id, delta, self.micro_batches, *self._padding)
        if self.length_buckets > 0 and self._single_process():  # under DDP Lightning shards a plain shuffle
            sampler = LengthBucketBatches(  # a bucket of 1 batch: random batches, each of one group
                [len(x) for x in self.train_table.input_ids],
                self.batch_size,
                self.length_buckets,
                self.seed,
                self.train_table.groups,
            )
            return DataLoader(
                _Rows(len(self.train_table)),
                batch_sampler=sampler,
                collate_fn=collate,
                num_workers=self.num_workers,
                persistent_workers=self.num_workers > 0,
            )
        return self._loader(_Rows(len(self.train_table)), collate, True, self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return self._loader(
            _Rows(len(self.val_table)),
            PromptCollate(self.val_table, self.pad_id, None, self.micro_batches, *self._padding),
            False,
            self.eval_batch_size,
        )
