"""Score prompts with an exported checkpoint: no Lightning, batched, dynamic padding."""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from pipeline.hashing import sha256_file
from pipeline.ranking.checkpoint import (
    DECODER,
    FILES_SHA256,
    LEXICAL,
    META,
    TYPICAL_SCORE,
    WEIGHTS,
    CheckpointError,
    read_meta,
)

# a checkpoint holds one of these: save_pretrained of a fast tokenizer writes tokenizer.json, a slow BERT one vocab.txt
CHECKPOINT_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
SCORE_DIRECTION = "higher_is_longer"
# how the encoder computes: float32, or bfloat16 autocast (as bf16-mixed training does); auto =
# bf16-mixed where bfloat16 is native (CPU AVX512-BF16 / AMX, a GPU that supports it), else 32-true
PRECISIONS = ("32-true", "bf16-mixed", "auto")


def load_meta(path: Path) -> dict:
    """read_meta (files, format version, weights hash), then the hash of every file export listed."""
    meta = read_meta(path)
    verify_files(path, meta)
    return meta


def verify_files(path: Path, meta: dict) -> None:
    """Every file pars.json lists (config, tokenizer files, weights; an export's lexical and decoder
    files too) must be there and unchanged: a changed config.json or tokenizer file would load
    silently and score differently."""
    listed = meta.get(FILES_SHA256)
    if listed is None:
        return  # a checkpoint written before files were listed: only the weights are hashed
    if not isinstance(listed, dict) or not all(isinstance(v, str) for v in listed.values()):
        raise CheckpointError(f"checkpoint {path}: {META} {FILES_SHA256} is not a mapping of file name to sha256")
    for name, expected in sorted(listed.items()):
        file = path / name
        if not name or "\x00" in name or Path(name).is_absolute() or ".." in Path(name).parts:
            # (lexical: files may be links into a DVC cache) never read outside the checkpoint
            raise CheckpointError(f"checkpoint {path}: {META} lists {name!r}, which is not a file of the checkpoint")
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name} (listed in {META} {FILES_SHA256})")
        actual = sha256_file(file)
        if actual != expected:
            raise CheckpointError(
                f"checkpoint {path}: {name} sha256 {actual[:12]}… does not match {META} "
                f"({expected[:12]}…); the file was changed after the checkpoint was written"
            )


def _added_regression(path: Path, meta: dict, key: str, weight_names: tuple[str, str]) -> tuple[dict, float, float]:
    """(spec, weights) of the regression pars.json `key` adds to the score, its files' hashes checked."""
    spec = meta[key]
    if not isinstance(spec, dict):
        raise CheckpointError(f"checkpoint {path}: {META} {key} is not an object")
    weights = [spec.get(name) for name in weight_names]
    if not all(isinstance(w, (int, float)) and not isinstance(w, bool) and np.isfinite(w) for w in weights):
        raise CheckpointError(f"checkpoint {path}: {META} {key} needs finite {' and '.join(weight_names)}")
    listed = spec.get("files_sha256")
    if not isinstance(listed, dict) or not listed:
        raise CheckpointError(f"checkpoint {path}: {META} {key} lists no files_sha256")
    verify_files(path, {FILES_SHA256: listed})
    return spec, float(weights[0]), float(weights[1])


def load_lexical(path: Path, meta: dict):
    """(TfidfRidge, encoder_weight, lexical_weight) of a blended checkpoint, its files' hashes checked."""
    from pipeline.ranking.lexical import TfidfRidge

    spec, encoder_weight, lexical_weight = _added_regression(path, meta, LEXICAL, ("encoder_weight", "lexical_weight"))
    ngram_max = spec.get("ngram_max")
    if isinstance(ngram_max, bool) or not isinstance(ngram_max, int) or ngram_max < 1:
        raise CheckpointError(f"checkpoint {path}: {META} {LEXICAL} ngram_max {ngram_max!r} is not a positive int")
    try:
        model = TfidfRidge.load(path, ngram_max=ngram_max)
    except ValueError as exc:
        raise CheckpointError(f"checkpoint {path}: {exc}") from exc
    return model, encoder_weight, lexical_weight


def load_decoder(path: Path, meta: dict, device: str = "cpu"):
    """(DecoderPrior, score_weight, decoder_weight) of a checkpoint with a decoder prior, its files'
    hashes checked."""
    from pipeline.ranking.decoder import DecoderPrior

    spec, score_weight, decoder_weight = _added_regression(path, meta, DECODER, ("score_weight", "decoder_weight"))
    layers, max_length = spec.get("layers"), spec.get("max_length")
    head = spec.get("head", "ridge")  # checkpoints written before the pairwise head carry a ridge
    if (
        not isinstance(layers, list)
        or not layers
        or not all(isinstance(k, int) and not isinstance(k, bool) for k in layers)
        or isinstance(max_length, bool)
        or not isinstance(max_length, int)
    ):
        raise CheckpointError(f"checkpoint {path}: {META} {DECODER} needs integer layers and max_length")
    try:
        prior = DecoderPrior.load(path, layers, max_length, device, head=head)
    except Exception as exc:  # a half-written or foreign decoder directory
        raise CheckpointError(f"checkpoint {path}: the decoder prior could not be loaded: {exc}") from exc
    return prior, score_weight, decoder_weight


# "int8": the encoder's Linear layers with int8 weights (per output channel) and activations
# quantized on the fly, on the CPU; the head stays float. About 3x less scoring CPU, and a
# somewhat different ranking (val tau_b, both speeds: benchmarks/scorer_int8.py ->
# metrics/choices/scorer_int8.json). "none": the float model evaluate scored.
QUANTIZE_MODES = ("none", "int8")


def resolve_precision(precision: str, device: str) -> str:
    """`Scorer`'s precision as computed: `auto` becomes bf16-mixed where bfloat16 is native (on
    the ranker's ChatGPT val prompts: 1.8x the scoring rate, val tau_b within 0.0002 of float32,
    metrics/choices/scoring_precision.json), else 32-true (emulated bfloat16 is far slower)."""
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"scorer precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        return precision
    from pipeline.hardware import auto_precision

    return auto_precision(torch.device(device).type)


def check_quantize(quantize: str, device: str) -> None:
    """ValueError unless `quantize` is a mode that runs on `device` (int8: the CPU only)."""
    if quantize not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {list(QUANTIZE_MODES)}, got {quantize!r}")
    if quantize == "int8":
        import torch

        if torch.device(device).type != "cpu":
            raise ValueError(f"quantize 'int8' runs on the CPU only, not on device {device!r}")


def quantize_encoder_int8(model):
    """A copy of the ranker whose encoder Linear layers are dynamically quantized (torch.ao)."""
    import copy
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    spec = {
        name: per_channel_dynamic_qconfig
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.startswith("encoder.")
    }
    with warnings.catch_warnings():  # torch.ao's deprecation notice, once per load, says nothing to act on
        warnings.simplefilter("ignore", UserWarning)
        return quantize_dynamic(copy.deepcopy(model).eval(), spec, dtype=torch.qint8)


def check_batch_size(batch_size) -> int:
    """`batch_size` as an int >= 1, else ValueError: a negative one used to score no batch and return
    uninitialised memory as scores (0 failed inside range())."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"scorer batch_size {batch_size!r}: must be an integer >= 1")
    return int(batch_size)


class Scorer:
    """Loads a checkpoint written by `save_checkpoint`; `score(texts)` -> higher = longer answer."""

    def __init__(
        self,
        model,
        tokenizer,
        meta: dict,
        device: str = "cpu",
        batch_size: int = 32,
        quantize: str = "none",
        lexical=None,
        decoder=None,
        precision: str = "32-true",
    ):
        batch_size = check_batch_size(batch_size)
        max_length = meta.get("max_length")
        if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral) or max_length < 2:
            raise ValueError(f"scorer max_length {max_length!r} (checkpoint meta): must be an integer >= 2")
        check_quantize(quantize, device)
        if quantize == "int8" and precision == "bf16-mixed":
            raise ValueError("scorer: quantize int8 computes in int8 layers; precision bf16-mixed cannot apply to them")
        if quantize == "int8":
            model = quantize_encoder_int8(model)
        self.quantize = quantize
        # int8 layers compute in their own way: autocast would not apply to them
        self.precision = "32-true" if quantize == "int8" else resolve_precision(precision, device)
        self.model = model.eval().to(device)
        self.model.head_in_float32 = True  # under bf16-mixed: scores without bfloat16 ties
        self.tokenizer = tokenizer
        self.meta = meta
        self.device = device
        self.batch_size = batch_size
        self.max_length = int(max_length)
        self.head_fraction = float(meta.get("head_fraction", 1.0))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # a blended checkpoint (the blend stage): encoder_weight * encoder score + lexical_weight *
        # TF-IDF ridge prediction; None: the encoder's score alone
        self.lexical = lexical
        # a checkpoint with a decoder prior: score_weight * the score above + decoder_weight * the
        # decoder head's prediction; None: the score above alone
        self.decoder = decoder

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str = "cpu",
        batch_size: int = 32,
        quantize: str = "none",
        precision: str = "32-true",
    ) -> "Scorer":
        """Load and validate a checkpoint dir; any defect is a CheckpointError naming the dir."""
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoTokenizer

        from pipeline.ranking.model import LengthRanker, encode_prompts

        check_batch_size(batch_size)  # before the checkpoint loads
        path = Path(path)
        meta = load_meta(path)  # missing files, unknown format version, hashes of weights and files
        if not any((path / name).is_file() for name in CHECKPOINT_TOKENIZER_FILES):
            raise CheckpointError(
                f"checkpoint {path} has no tokenizer files (expected one of {CHECKPOINT_TOKENIZER_FILES})"
            )
        if meta.get("score_direction") != SCORE_DIRECTION:
            raise CheckpointError(
                f"checkpoint {path}: score_direction {meta.get('score_direction')!r} is not {SCORE_DIRECTION!r}"
            )
        if (
            isinstance(meta.get("max_length"), bool)
            or not isinstance(meta.get("max_length"), int)
            or meta["max_length"] < 2
        ):
            raise CheckpointError(f"checkpoint {path}: max_length {meta.get('max_length')!r} is not a length")
        typical = meta.get(TYPICAL_SCORE)
        median = typical.get("median") if isinstance(typical, dict) else None
        if typical is not None and (
            isinstance(median, bool) or not isinstance(median, (int, float)) or not math.isfinite(median)
        ):
            raise CheckpointError(f"checkpoint {path}: {TYPICAL_SCORE} {typical!r} has no finite median")
        head = meta.get("head_fraction", 1.0)
        if isinstance(head, bool) or not isinstance(head, (int, float)) or not 0.0 <= head <= 1.0:
            raise CheckpointError(f"checkpoint {path}: head_fraction {head!r} is not a number in [0, 1]")
        try:
            config = AutoConfig.from_pretrained(path)
            tokenizer = AutoTokenizer.from_pretrained(path)
            # absent = cls (older checkpoints); LengthRanker refuses an unknown pooling
            model = LengthRanker.from_config(config, pooling=meta.get("pooling", "cls"))
            model.load_state_dict(load_file(str(path / WEIGHTS)))  # strict: every tensor must match
        except Exception as exc:  # a half-written or foreign directory
            raise CheckpointError(f"checkpoint {path} could not be loaded: {exc}") from exc
        positions = getattr(config, "max_position_embeddings", None)
        if isinstance(positions, int) and meta["max_length"] > positions:
            # longer inputs would index past the position table and fail at the first long prompt
            raise CheckpointError(
                f"checkpoint {path}: max_length {meta['max_length']} exceeds the encoder's "
                f"max_position_embeddings {positions} (config.json)"
            )
        try:  # a max_length the tokenizer's frame fills would fail at the first prompt, naming no checkpoint
            encode_prompts(tokenizer, ["a"], meta["max_length"], head)
        except ValueError as exc:
            raise CheckpointError(f"checkpoint {path}: {exc}") from exc
        lexical = load_lexical(path, meta) if LEXICAL in meta else None
        decoder = load_decoder(path, meta, device) if DECODER in meta else None
        return cls(
            model,
            tokenizer,
            meta,
            device=device,
            batch_size=batch_size,
            quantize=quantize,
            lexical=lexical,
            decoder=decoder,
            precision=precision,
        )

    @property
    def typical_score(self) -> float | None:
        """The checkpoint's median score on its val prompts (written by export), else None."""
        typical = self.meta.get(TYPICAL_SCORE)
        return float(typical["median"]) if isinstance(typical, dict) else None

    def score(self, texts: Sequence[str], batch_size: int | None = None, progress: bool = False) -> np.ndarray:
        """Scores in input order, computed under inference mode.

        Prompts are tokenized once (cut to max_length head + tail, as in training), then batched in
        order of token length so each batch is padded only to its own longest prompt: on mixed
        lengths this does much less padded work than batching in input order."""
        return self._score_stored(as_stored(texts), batch_size, progress)

    def _score_stored(self, texts: list[str], batch_size: int | None, progress: bool) -> np.ndarray:
        """`score` of texts already normalised by `as_stored`."""
        out = np.empty(len(texts), dtype=np.float32)
        # the decoder prior, if any, is added once over the whole list: it batches by its own token
        # lengths, not the encoder's (12.7 against 10.8 prompts/s on ChatGPT val,
        # metrics/choices/decoder_scoring-recorded.json)
        for rows, scores in self._parts_of_stored(texts, batch_size, progress, with_decoder=False):
            out[rows] = scores
        return self.add_decoder(out, texts, progress)

    def score_parts(
        self,
        texts: Sequence[str],
        batch_size: int | None = None,
        progress: bool = False,
        with_decoder: bool = True,
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(rows of `texts`, their scores) for each forward batch as it finishes, shortest prompts
        first: what `score` computes, delivered incrementally (the scheduler's background worker).
        `with_decoder=False` leaves out the decoder prior (the caller adds it with `add_decoder`)."""
        yield from self._parts_of_stored(as_stored(texts), batch_size, progress, with_decoder)

    def _parts_of_stored(
        self, texts: list[str], batch_size: int | None, progress: bool, with_decoder: bool
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """`score_parts` of texts already normalised by `as_stored`."""
        import torch

        ids = self.encode(texts)
        for rows, input_ids, attention_mask in _length_sorted_batches(
            ids, self.pad_id, self.batch_size if batch_size is None else batch_size, progress
        ):
            with torch.inference_mode(), self.autocast():
                scores = self.model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device))
            yield rows, self.combine(scores.float().cpu().numpy(), [texts[r] for r in rows], with_decoder)

    def autocast(self):
        """The context the encoder runs in: bfloat16 autocast for bf16-mixed (the linear layers and
        attention in bfloat16, layer norms and softmax in float32), else none."""
        import torch

        device_type = "cuda" if str(self.device).startswith("cuda") else "cpu"
        return torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.precision == "bf16-mixed")

    def combine(
        self,
        encoder_scores: np.ndarray,
        texts: Sequence[str],
        with_decoder: bool = True,
        lexical_prediction: np.ndarray | None = None,
    ) -> np.ndarray:
        """The checkpoint's score from its encoder's scores of `texts`: the encoder's alone, or
        blended with the lexical model's prediction (a blended checkpoint), then with the decoder
        prior's (a checkpoint that carries one, unless `with_decoder` is False).
        `lexical_prediction`: the lexical model's prediction of `texts` when already computed."""
        score = encoder_scores
        if self.lexical is not None:
            model, encoder_weight, lexical_weight = self.lexical
            if lexical_prediction is None:
                lexical_prediction = model.predict(texts)
            score = _weighted_sum(encoder_weight, encoder_scores, lexical_weight, lexical_prediction)
        return self.add_decoder(score, texts) if with_decoder else score

    def add_decoder(self, scores: np.ndarray, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """`scores` (of `texts`, without the decoder prior) with the decoder prior added; unchanged
        for a checkpoint without one."""
        if self.decoder is None or len(scores) == 0:
            return scores
        prior, score_weight, decoder_weight = self.decoder
        return _weighted_sum(score_weight, scores, decoder_weight, prior.predict(texts, progress))

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids as the model sees them: cut to max_length, head + tail, as in training."""
        from pipeline.ranking.model import encode_prompts

        texts = _text_list(texts)
        return encode_prompts(self.tokenizer, texts, self.max_length, self.head_fraction) if texts else []


def _weighted_sum(weight_a: float, a: np.ndarray, weight_b: float, b: np.ndarray) -> np.ndarray:
    """weight_a * a + weight_b * b, in float64, as float32 scores. Past float32's range (a hand-edited
    weight) a score is inf or NaN without numpy's overflow warning, for the caller's non-finite check
    to refuse in one line."""
    with np.errstate(over="ignore", invalid="ignore"):
        return (weight_a * np.asarray(a, np.float64) + weight_b * np.asarray(b, np.float64)).astype(np.float32)


def as_stored(texts: Sequence[str]) -> list[str]:
    """Prompts as training saw them (the prepare stage stores Unicode NFC, stripped): a prompt that
    reaches the server decomposed (NFD) would otherwise split into other words for the lexical prior."""
    from pipeline.sources.base import normalise

    return [normalise(_encodable(text)) for text in _text_list(texts)]


def _text_list(texts: Sequence[str]) -> list[str]:
    """`texts` as a list of str; TypeError for anything else, and for one bare str (whose
    characters would each be scored as a prompt)."""
    if isinstance(texts, str):
        raise TypeError("score: texts is one str; pass a list of prompts (e.g. [text])")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"score: item {i} is {type(text).__name__}, not str")
    return texts


def _encodable(text: str) -> str:
    """`text` with each lone UTF-16 surrogate (JSON can escape one: "\\ud800") as '?': no tokenizer
    takes it, and the whole batch would fail. Other text is returned as is (encoding it is the check).
    `pars score` refuses such a line instead, naming it (a file can be fixed); here, on the serving
    path, one client's prompt must not fail the batch of others."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _length_sorted_batches(ids: list[list[int]], pad_id: int, batch_size: int, progress: bool):
    """(rows, input_ids, attention_mask) per batch, shortest prompts first (each batch padded only
    to its own longest prompt)."""
    from pipeline.ranking.model import pad_batch

    batch_size = check_batch_size(batch_size)  # also a score(..., batch_size=) override
    order = np.argsort([len(x) for x in ids], kind="stable")
    starts = range(0, len(ids), batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="scoring", unit="batch", leave=False)
    for start in starts:
        rows = order[start : start + batch_size]
        yield (rows, *pad_batch([ids[r] for r in rows], pad_id))


def shared_lower_layers(a, b) -> int:
    """How many transformer layers two LengthRankers share bit for bit after identical embeddings
    (the frozen, cached lower layers of predictors trained from one encoder); -1 when even the
    embeddings differ or either has no layers the split forward knows (BERT-style or Llama)."""
    import torch

    def same(x, y) -> bool:
        sx, sy = x.state_dict(), y.state_dict()
        return sx.keys() == sy.keys() and all(
            isinstance(sx[k], torch.Tensor)  # quantized layers hold packed params: never "the same"
            and isinstance(sy[k], torch.Tensor)
            and sx[k].shape == sy[k].shape
            and torch.equal(sx[k], sy[k])
            for k in sx
        )

    def architecture(model) -> dict:  # what makes equal weights compute the same (not names or depth)
        config = getattr(model.encoder, "config", None)
        skip = ("name_or_path", "num_hidden_layers", "transformers_version", "architectures")
        return {
            k: v for k, v in (config.to_dict() if config else {}).items() if not k.startswith("_") and k not in skip
        }

    try:
        layers_a, layers_b = a._layers(), b._layers()
    except ValueError:
        return -1
    if architecture(a) != architecture(b) or not same(a.embeddings_module(), b.embeddings_module()):
        return -1
    n = 0
    while n < min(len(layers_a), len(layers_b)) and same(layers_a[n], layers_b[n]):
        n += 1
    return n


def score_together(
    scorers: Sequence[Scorer], texts: Sequence[str], batch_size: int | None = None, progress: bool = False
) -> list[np.ndarray]:
    """`[s.score(texts) for s in scorers]`, with the work the scorers have in common done once.

    Scorers that cut prompts to the same token ids and share their embeddings and lower layers bit
    for bit (predictors fine-tuned from one encoder with `train.frozen_layers` > 0) run those
    layers once per batch, then each its own upper layers and head: the same scores up to float
    rounding (score_from(hidden_after(x)) == forward(x), tested), for a fraction of the work."""
    import torch

    texts = as_stored(texts)
    outs = [np.empty(len(texts), dtype=np.float32) for _ in scorers]
    if not texts:
        return outs
    ids = shared_token_ids(scorers, texts)
    lexical = shared_lexical_predictions(scorers, texts)
    for members, n_shared in share_groups(scorers, ids):
        if len(members) == 1:
            outs[members[0]][:] = scorers[members[0]]._score_stored(texts, batch_size, progress)
            continue
        lead = scorers[members[0]]
        for rows, input_ids, attention_mask in _length_sorted_batches(
            ids[members[0]], lead.pad_id, lead.batch_size if batch_size is None else batch_size, progress
        ):
            input_ids, attention_mask = input_ids.to(lead.device), attention_mask.to(lead.device)
            with torch.inference_mode(), lead.autocast():
                hidden = lead.model.hidden_after(input_ids, attention_mask, n_shared)
                for m in members:
                    encoder_scores = scorers[m].model.score_from(hidden, attention_mask, n_shared).float().cpu().numpy()
                    outs[m][rows] = scorers[m].combine(
                        encoder_scores,
                        [texts[r] for r in rows],
                        with_decoder=False,
                        lexical_prediction=None if lexical[m] is None else lexical[m][rows],
                    )
        for m in members:  # as in Scorer.score: the decoder prior once over the whole list
            outs[m][:] = scorers[m].add_decoder(outs[m], texts, progress)
    return outs


def shared_token_ids(scorers: Sequence[Scorer], texts: Sequence[str]) -> list[list[list[int]]]:
    """Each scorer's token ids of `texts`, tokenized once per distinct (tokenizer, max_length,
    head_fraction): the predictors of one encoder share one list."""
    done: dict[tuple, list[list[int]]] = {}
    out = []
    for scorer in scorers:
        key = (_tokenizer_fingerprint(scorer.tokenizer), scorer.max_length, scorer.head_fraction)
        if key not in done:
            done[key] = scorer.encode(texts)
        out.append(done[key])
    return out


def _tokenizer_fingerprint(tokenizer) -> str | int:
    """What decides a fast tokenizer's ids (its vocabulary, normaliser, pre-tokenizer, model and
    post-processor); the truncation and padding state, which each call resets, left out. A slow
    tokenizer is only ever equal to itself."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return id(tokenizer)
    spec = json.loads(backend.to_str())
    spec.pop("truncation", None)
    spec.pop("padding", None)
    # a chat template frames every prompt (pipeline.ranking.model.encode_prompts)
    spec["chat_template"] = getattr(tokenizer, "chat_template", None)
    return type(tokenizer).__name__ + json.dumps(spec, sort_keys=True)


def shared_lexical_predictions(scorers: Sequence[Scorer], texts: Sequence[str]) -> list[np.ndarray | None]:
    """Each scorer's lexical prediction of `texts` (None without a lexical model), computed once
    per distinct lexical model: one train model's methods carry the same fit."""
    done: list[tuple] = []
    out = []
    for scorer in scorers:
        if scorer.lexical is None:
            out.append(None)
            continue
        model = scorer.lexical[0]
        prediction = next((p for other, p in done if other.same_as(model)), None)
        if prediction is None:
            prediction = model.predict(list(texts))
            done.append((model, prediction))
        out.append(prediction)
    return out


def share_groups(scorers: Sequence[Scorer], ids: list[list[list[int]]]) -> list[tuple[list[int], int]]:
    """(member indices, shared layers) per group of scorers that see the same token ids and share
    at least one lower layer after identical embeddings; every other scorer is a group of its own."""
    groups: list[list] = []
    for i, scorer in enumerate(scorers):
        for group in groups:
            lead = scorers[group[0][0]]
            same_input = ids[i] == ids[group[0][0]]
            setting = (scorer.pad_id, scorer.device, scorer.precision)
            if not same_input or setting != (lead.pad_id, lead.device, lead.precision):
                continue
            if scorer.quantize != "none" or lead.quantize != "none":
                continue  # quantized layers are neither compared nor shared
            common = shared_lower_layers(lead.model, scorer.model)
            if common >= 1:
                group[0].append(i)
                group[1] = min(group[1], common)
                break
        else:
            groups.append([[i], scorer.model.num_layers if _bert_style(scorer.model) else 0])
    return [(members, n_shared) for members, n_shared in groups]


def _bert_style(model) -> bool:
    try:
        model._layers()
    except ValueError:
        return False
    return True
