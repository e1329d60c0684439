"""Scorer (serving loader) and `pars score`: loading, refusals, batching invariance, input errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from pipeline.ranking.checkpoint import META, WEIGHTS, CheckpointError
from pipeline.serving.scorer import Scorer

TEXTS = [
    "hi",
    "Write a long essay about the history of the Roman empire, with sources.",
    "2+2?",
    "Explain quantum computing " * 8,
    "Translate 'cat' to French.",
    "List ten prime numbers.",
    "",
    "Summarise this paragraph: " + "lorem ipsum " * 40,
]


def test_scores_independent_of_batching_and_order(tiny_checkpoint):
    scorer = Scorer.from_pretrained(tiny_checkpoint)
    ref = scorer.score(TEXTS, batch_size=len(TEXTS))
    assert ref.dtype == np.float32 and ref.shape == (len(TEXTS),) and np.isfinite(ref).all()
    assert np.ptp(ref) > 0  # a random model still tells prompts apart
    # dynamic padding must not change a prompt's score: batch 1 (no padding) = batch 3 = one batch
    np.testing.assert_allclose(scorer.score(TEXTS, batch_size=1), ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(scorer.score(TEXTS, batch_size=3), ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(scorer.score(TEXTS[::-1], batch_size=3), ref[::-1], rtol=1e-4, atol=1e-5)
    assert scorer.score([]).shape == (0,)
    with pytest.raises(TypeError, match="item 1"):
        scorer.score(["ok", None])


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_a_batch_size_override_below_one_is_refused_never_the_default(tiny_checkpoint, bad):
    """score(..., batch_size=0) used to fall back to the scorer's own 32 (0 is falsy) and score."""
    from pipeline.serving.scorer import score_together

    scorer = Scorer.from_pretrained(tiny_checkpoint)
    with pytest.raises(ValueError, match="batch_size"):
        scorer.score(TEXTS, batch_size=bad)
    with pytest.raises(ValueError, match="batch_size"):
        list(scorer.score_parts(TEXTS, batch_size=bad))
    # one scorer alone, and two that share their layers (scored in one pass)
    for scorers in ([scorer], [scorer, Scorer.from_pretrained(tiny_checkpoint)]):
        with pytest.raises(ValueError, match="batch_size"):
            score_together(scorers, TEXTS, batch_size=bad)


def test_long_prompts_are_truncated_to_max_length(tiny_checkpoint):
    scorer = Scorer.from_pretrained(tiny_checkpoint)
    assert scorer.max_length == 64
    base = " ".join(f"word{i}" for i in range(200))  # far beyond 64 tokens
    a, b, short = scorer.score([base, base + " and a different ending entirely", "word0 word1"])
    assert a == pytest.approx(b, abs=1e-6)  # only the first 64 tokens are seen, as in training
    assert a != pytest.approx(short, abs=1e-6)


def test_an_mpnet_checkpoint_scores_as_its_own_forward(tmp_path, tokenizer):
    """`train.encoder` may be an MPNet (all-mpnet-base-v2): its checkpoint loads and scores through
    the split forward (relative-position bias passed to every layer) as the encoder's own forward."""
    import torch
    from conftest import make_tiny_ranker
    from transformers import MPNetConfig

    from pipeline.ranking.checkpoint import save_checkpoint
    from pipeline.ranking.model import encode_prompts, pad_batch

    config = MPNetConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=130,
        pad_token_id=tokenizer.pad_token_id,
    )
    ranker = make_tiny_ranker(config).eval()
    ckpt = save_checkpoint(ranker, tokenizer, tmp_path / "mpnet", method="pairwise", max_length=64, encoder="mpnet")
    scores = Scorer.from_pretrained(ckpt).score(TEXTS, batch_size=3)
    ids, mask = pad_batch(encode_prompts(tokenizer, TEXTS, 64, 1.0), tokenizer.pad_token_id)
    with torch.no_grad():
        expected = ranker.full_forward(input_ids=ids, attention_mask=mask).numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-5)


def _refuses(path, match):
    with pytest.raises(CheckpointError, match=match):
        Scorer.from_pretrained(path)


def test_refuses_missing_files_unknown_version_and_bad_hash(tiny_checkpoint):
    _refuses(tiny_checkpoint.parent / "nowhere", "does not exist")
    # the directory above a checkpoint: the error names the checkpoint inside it
    _refuses(tiny_checkpoint.parent, f"missing pars.json; checkpoints inside it: {tiny_checkpoint.as_posix()}$")
    meta = json.loads((tiny_checkpoint / META).read_text())

    (tiny_checkpoint / META).write_text(json.dumps({**meta, "format_version": 99}))
    _refuses(tiny_checkpoint, "format_version 99 is not supported")
    (tiny_checkpoint / META).write_text(json.dumps({**meta, "score_direction": "lower_is_longer"}))
    _refuses(tiny_checkpoint, "score_direction")
    (tiny_checkpoint / META).write_text("[]")  # read_meta refuses what is not an object, for every reader
    _refuses(tiny_checkpoint, "pars.json holds a JSON list, not an object")
    (tiny_checkpoint / META).write_text("[" * 100_000 + "]" * 100_000)
    _refuses(tiny_checkpoint, "pars.json is not valid JSON \\(nested too deeply\\)")
    (tiny_checkpoint / META).write_text(json.dumps(meta))

    weights = tiny_checkpoint / WEIGHTS
    blob = bytearray(weights.read_bytes())
    blob[-10] ^= 0xFF  # one flipped byte in a tensor
    weights.write_bytes(bytes(blob))
    _refuses(tiny_checkpoint, "sha256 .* does not match")
    blob[-10] ^= 0xFF
    weights.write_bytes(bytes(blob))
    Scorer.from_pretrained(tiny_checkpoint)  # restored: loads again

    tokenizer_file = next(n for n in ("tokenizer.json", "vocab.txt") if (tiny_checkpoint / n).is_file())
    for name in ("tokenizer.json", "vocab.txt"):
        (tiny_checkpoint / name).unlink(missing_ok=True)
    _refuses(tiny_checkpoint, f"missing {tokenizer_file} \\(listed in pars.json files_sha256\\)")
    # a checkpoint written before files were listed: the tokenizer is still looked for
    (tiny_checkpoint / META).write_text(json.dumps({k: v for k, v in meta.items() if k != "files_sha256"}))
    _refuses(tiny_checkpoint, "no tokenizer files")
    (tiny_checkpoint / "config.json").unlink()
    _refuses(tiny_checkpoint, "missing config.json")


def test_serving_needs_no_lightning(tiny_checkpoint):
    code = (
        "import sys; from pipeline.serving import Scorer; "
        f"s = Scorer.from_pretrained({str(tiny_checkpoint)!r}).score(['hello']); "
        "bad = [m for m in sys.modules if 'lightning' in m]; assert not bad, bad; print(float(s[0]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip()) == pytest.approx(
        float(Scorer.from_pretrained(tiny_checkpoint).score(["hello"])[0]), abs=1e-5
    )


# ---------------------------------------------------------------- pars score


def _cli(*argv):
    from pipeline.cli import main

    return main(["score", *map(str, argv)])


def test_pars_score_jsonl_and_parquet(tiny_checkpoint, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(
        "\n".join(json.dumps({"id": f"q{i}", "prompt": t}) for i, t in enumerate(TEXTS)) + "\n\n", encoding="utf-8"
    )
    expected = Scorer.from_pretrained(tiny_checkpoint).score(TEXTS)
    assert _cli(src, "--checkpoint", tiny_checkpoint) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == [f"q{i}" for i in range(len(TEXTS))]
    np.testing.assert_allclose([r["score"] for r in rows], expected, rtol=1e-4, atol=1e-5)
    bom = tmp_path / "bom.jsonl"  # as some editors save UTF-8: a byte-order mark before the first record
    bom.write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
    assert _cli(bom, "--checkpoint", tiny_checkpoint) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [r["id"] for r in rows]

    pq_in = tmp_path / "in.parquet"
    pd.DataFrame({"prompt_id": [f"p{i}" for i in range(len(TEXTS))], "text": TEXTS}).to_parquet(pq_in)
    out = tmp_path / "out" / "scores.parquet"
    assert _cli(pq_in, "--checkpoint", tiny_checkpoint, "--field", "text", "-o", out, "--batch-size", 2) == 0
    got = pd.read_parquet(out)
    assert list(got.columns) == ["index", "prompt_id", "score"]
    np.testing.assert_allclose(got["score"], expected, rtol=1e-4, atol=1e-5)


def test_pars_score_says_why_an_id_only_some_records_carry_is_not_written(tiny_checkpoint, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt": "one"}\n{"prompt": "two"}\n{"id": "c", "prompt": "three"}\n')
    assert _cli(src, "--checkpoint", tiny_checkpoint) == 0
    out, err = capsys.readouterr()
    assert [sorted(json.loads(line)) for line in out.splitlines()] == [["index", "score"]] * 3
    assert "'id' is in 2 of 3 records only: no id column written" in err


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n', "in.jsonl:2: not valid UTF-8"),
        (b'{"prompt": "fine"}\n\n{"prompt": "unterminated}\n', "in.jsonl:3: malformed JSON"),
        (b'{"prompt": "fine"}\n{"text": "no prompt"}\n', "in.jsonl:2: missing text field 'prompt'"),
        (b'{"prompt": 42}\n', "in.jsonl:1: field 'prompt' is int"),
        (b'["a list"]\n', "in.jsonl:1: expected a JSON object"),
    ],
)
def test_pars_score_bad_input_names_file_and_line(tiny_checkpoint, tmp_path, capsys, content, message):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    assert _cli(src, "--checkpoint", tiny_checkpoint) == 1
    assert message in capsys.readouterr().err


def test_pars_score_bad_parquet_and_checkpoint(tiny_checkpoint, tmp_path, capsys):
    pq_in = tmp_path / "in.parquet"
    pd.DataFrame({"text": ["a"]}).to_parquet(pq_in)
    assert _cli(pq_in, "--checkpoint", tiny_checkpoint) == 1
    assert "no column 'prompt'" in capsys.readouterr().err
    pd.DataFrame({"prompt": ["a", None]}).to_parquet(pq_in)
    assert _cli(pq_in, "--checkpoint", tiny_checkpoint) == 1
    assert "row 1: field 'prompt' is null" in capsys.readouterr().err
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    assert _cli(tmp_path / "junk.parquet", "--checkpoint", tiny_checkpoint) == 1
    assert "not a readable parquet file" in capsys.readouterr().err
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"prompt": "x"}\n')
    assert _cli(ok, "--checkpoint", tmp_path / "nowhere") == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.packaged
def test_packaged_minilm_checkpoint_round_trip(tmp_path, tokenizer):
    """The real packaged encoder through save_checkpoint -> Scorer (what export ships)."""
    import torch

    from pipeline.ranking.checkpoint import save_checkpoint
    from pipeline.ranking.model import LengthRanker

    torch.manual_seed(0)
    model = LengthRanker.from_pretrained_encoder("minilm-l6").eval()
    path = save_checkpoint(
        model, tokenizer, tmp_path / "minilm", method="pairwise", max_length=128, encoder="minilm-l6"
    )
    scorer = Scorer.from_pretrained(path, batch_size=4)
    got = scorer.score(TEXTS)
    with torch.inference_mode():
        enc = tokenizer(TEXTS, padding=True, truncation=True, max_length=128, return_tensors="pt")
        direct = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).numpy()
    np.testing.assert_allclose(got, direct, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_pars_score_refuses_a_batch_size_below_one(tiny_checkpoint, tmp_path, capsys, value):
    from pipeline.score import main

    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "fine"}\n')
    with pytest.raises(SystemExit) as exc:
        main(["--checkpoint", str(tiny_checkpoint), str(src), "--batch-size", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--batch-size" in err and "Traceback" not in err


def test_score_together_shares_frozen_layers_and_matches_each_scorer(tiny_checkpoint, tiny_ranker, tokenizer, tmp_path):
    """Predictors fine-tuned from one encoder share their frozen lower layers: scored together,
    those run once, and every predictor's scores equal its own Scorer's."""
    import torch

    from pipeline.ranking.checkpoint import save_checkpoint
    from pipeline.serving.scorer import score_together, share_groups, shared_lower_layers

    top_changed = copy_ranker(tiny_ranker)
    with torch.no_grad():  # a different upper layer and head: what fine-tuning above a frozen layer 0 does
        for p in [*top_changed._layers()[1].parameters(), *top_changed.head.parameters()]:
            p.add_(torch.randn_like(p) * 0.1)
    all_changed = copy_ranker(tiny_ranker)
    with torch.no_grad():
        for p in all_changed.encoder.embeddings.parameters():
            p.add_(0.01)
    assert shared_lower_layers(tiny_ranker, top_changed) == 1
    assert shared_lower_layers(tiny_ranker, copy_ranker(tiny_ranker)) == 2
    assert shared_lower_layers(tiny_ranker, all_changed) == -1
    dirs = [tiny_checkpoint]
    for name, model in (("top", top_changed), ("all", all_changed)):
        dirs.append(
            save_checkpoint(model, tokenizer, tmp_path / name, method="pairwise", max_length=64, encoder="tiny")
        )
    dirs.append(  # same weights, other max_length: other token ids, so it is never grouped
        save_checkpoint(tiny_ranker, tokenizer, tmp_path / "short", method="pairwise", max_length=8, encoder="tiny")
    )
    scorers = [Scorer.from_pretrained(d, batch_size=3) for d in dirs]
    groups = share_groups(scorers, [s.encode(TEXTS) for s in scorers])
    assert groups == [([0, 1], 1), ([2], 2), ([3], 2)]
    together = score_together(scorers, TEXTS)
    for scorer, scores in zip(scorers, together):
        np.testing.assert_allclose(scores, scorer.score(TEXTS), rtol=1e-4, atol=1e-5)
    assert not np.allclose(together[0], together[1])  # the shared pass did not hand one model's scores to another
    assert not np.allclose(together[0], together[3])
    assert [s.shape for s in score_together(scorers, [])] == [(0,)] * 4


def copy_ranker(model):
    import copy

    return copy.deepcopy(model).eval()


def test_int8_scorer_quantizes_the_encoder_only_and_keeps_the_order(tiny_checkpoint):
    import torch

    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.serving.scorer import quantize_encoder_int8

    float_scorer = Scorer.from_pretrained(tiny_checkpoint)
    int8 = Scorer.from_pretrained(tiny_checkpoint, quantize="int8")
    linear_names = ("query", "key", "value", "dense")
    kinds = {
        type(m).__module__
        for n, m in int8.model.named_modules()
        if n.startswith("encoder.") and n.endswith(linear_names) and "LayerNorm" not in n
    }
    assert kinds == {"torch.ao.nn.quantized.dynamic.modules.linear"}  # every encoder Linear is int8
    assert isinstance(int8.model.head, torch.nn.Linear)  # the head stays float
    original = float_scorer.model
    quantize_encoder_int8(original)
    assert isinstance(original.encoder.encoder.layer[0].intermediate.dense, torch.nn.Linear)  # works on a copy
    texts = TEXTS + [f"prompt number {i} " * (i % 7 + 1) for i in range(40)]
    a, b = float_scorer.score(texts), int8.score(texts)
    assert np.isfinite(b).all() and not np.array_equal(a, b)
    assert kendall_tau_b(a, b) > 0.8  # close to the float order, not equal to it
    with pytest.raises(ValueError, match="quantize"):
        Scorer.from_pretrained(tiny_checkpoint, quantize="int4")
    from pipeline.serving.scorer import share_groups

    pair = [float_scorer, int8]  # never grouped: an int8 scorer shares nothing with a float one
    assert share_groups(pair, [s.encode(TEXTS) for s in pair]) == [([0], 2), ([1], 2)]


def test_bf16_scorer_keeps_the_float_order_and_auto_follows_the_cpu(tiny_checkpoint):
    from pipeline.hardware import cpu_has_native_bf16
    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.serving.scorer import score_together, share_groups

    float_scorer = Scorer.from_pretrained(tiny_checkpoint)
    bf16 = Scorer.from_pretrained(tiny_checkpoint, precision="bf16-mixed")
    assert (float_scorer.precision, bf16.precision) == ("32-true", "bf16-mixed")
    texts = TEXTS + [f"prompt number {i} " * (i % 7 + 1) for i in range(40)]
    a, b = float_scorer.score(texts), bf16.score(texts)
    assert b.dtype == np.float32 and np.isfinite(b).all()
    assert not np.array_equal(a, b)  # computed in bfloat16: rounded differently
    assert kendall_tau_b(a, b) > 0.9 and len(np.unique(b)) > 0.9 * len(set(texts))  # the order kept, few ties
    # scored together: the shared lower layers run under the group's precision, never a mix
    pair = [float_scorer, bf16]
    assert share_groups(pair, [s.encode(texts) for s in pair]) == [([0], 2), ([1], 2)]
    twins = [bf16, Scorer.from_pretrained(tiny_checkpoint, precision="bf16-mixed")]
    for scores in score_together(twins, texts):
        np.testing.assert_allclose(scores, b, rtol=1e-2, atol=1e-2)
    auto = Scorer.from_pretrained(tiny_checkpoint, precision="auto").precision
    assert auto == ("bf16-mixed" if cpu_has_native_bf16() else "32-true")
    with pytest.raises(ValueError, match="precision"):
        Scorer.from_pretrained(tiny_checkpoint, precision="fp16")
    with pytest.raises(ValueError, match="int8"):
        Scorer.from_pretrained(tiny_checkpoint, quantize="int8", precision="bf16-mixed")
    assert Scorer.from_pretrained(tiny_checkpoint, quantize="int8", precision="auto").precision == "32-true"
