"""blend: a trained encoder + TF-IDF ridge as one checkpoint, the weight chosen on val; the lexical
model's files; the Scorer applying the blend (alone and beside other scorers)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import params_section, write_dataset, write_params

from pipeline.errors import PARSError
from pipeline.pairs import main as pairs_main
from pipeline.ranking.checkpoint import META, CheckpointError
from pipeline.ranking.lexical import VOCAB_FILE, WEIGHTS_FILE, TfidfRidge

TEXTS = ["write a long essay about rome", "say hi", "explain rome in detail", "hi there", "a long essay please"]
LENGTHS = [900, 5, 400, 8, 700]


def test_tfidf_ridge_saves_without_pickle_and_loads_the_same(tmp_path):
    fit = TfidfRidge.fit_grid(TEXTS * 3, LENGTHS * 3, alphas=[1.0], ngram_max=2, min_df=2)[0]
    settings = fit.save(tmp_path)
    assert settings == {"ngram_max": 2, "terms": len(fit.vectorizer.vocabulary_)}
    loaded = TfidfRidge.load(tmp_path, ngram_max=2)
    probe = TEXTS + ["an essay on something new", ""]
    np.testing.assert_allclose(loaded.predict(probe), fit.predict(probe), rtol=0, atol=1e-12)
    assert fit.predict(["a long essay"])[0] > fit.predict(["hi"])[0]  # it learned the words
    assert loaded.predict([]).shape == (0,)

    (tmp_path / VOCAB_FILE).write_text(json.dumps(["a", "a"]))
    with pytest.raises(ValueError, match=VOCAB_FILE):
        TfidfRidge.load(tmp_path, ngram_max=2)
    (tmp_path / VOCAB_FILE).write_text("[")
    with pytest.raises(ValueError, match="could not be read"):
        TfidfRidge.load(tmp_path, ngram_max=2)


def test_tfidf_ridge_grid_shares_one_vocabulary_and_alpha_shrinks():
    small, large = TfidfRidge.fit_grid(TEXTS * 3, LENGTHS * 3, alphas=[0.1, 100.0], ngram_max=1, min_df=1)
    assert small.vectorizer is large.vectorizer
    assert np.abs(large.coef).sum() < np.abs(small.coef).sum()


def test_cross_fitted_predictions_come_from_fits_without_their_fold():
    """Each out-of-fold prediction is the ridge fitted on the other folds (the same vocabulary), and
    the full fit is the one returned: a text whose words only it has is memorised by the full fit
    but not predicted by its out-of-fold one, even when the text occurs twice (as one prompt does
    in a cross-model set, once per model): identical texts share a fold."""
    from sklearn.linear_model import Ridge

    texts = [f"{t} {i}" for i in range(4) for t in TEXTS] + ["zebra zebra unique", "zebra zebra unique"]
    lengths = LENGTHS * 4 + [5000, 5000]
    full, oof = TfidfRidge.cross_fitted(texts, lengths, alpha=0.5, ngram_max=1, min_df=1, folds=3, seed=7)
    x, y = full.vectorizer.transform(texts), np.log1p(np.asarray(lengths, float))
    distinct, group = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
    fold = (np.random.default_rng(7).permutation(len(distinct)) % 3)[group]  # the documented rule
    assert fold[-1] == fold[-2] and len(set(fold)) == 3
    for k in range(3):
        held_out = fold == k
        ridge = Ridge(alpha=0.5).fit(x[~held_out], y[~held_out])
        np.testing.assert_allclose(oof[held_out], x[held_out] @ ridge.coef_ + ridge.intercept_, atol=1e-12)
    np.testing.assert_allclose(full.predict(texts), Ridge(alpha=0.5).fit(x, y).predict(x), atol=1e-12)
    assert full.predict(["zebra"])[0] > full.predict(["hi"])[0]
    assert oof[-1] < full.predict(texts[-1:])[0] - 1.0  # its twin did not hand it the answer
    with pytest.raises(ValueError, match="folds"):
        TfidfRidge.cross_fitted(TEXTS, LENGTHS, alpha=1.0, ngram_max=1, min_df=1, folds=1, seed=0)
    with pytest.raises(ValueError, match="distinct texts"):
        TfidfRidge.cross_fitted(["a", "a", "b"], [1, 2, 3], alpha=1.0, ngram_max=1, min_df=1, folds=3, seed=0)


@pytest.fixture
def toy_models(tmp_path, tiny_ranker, tokenizer):
    """Toy data (wording tells the length) with its pairs, and a random-encoder checkpoint
    models/toy/pairwise trained (nominally) on model toy: the lexical half ranks, the encoder barely."""
    from pipeline.ranking.checkpoint import save_checkpoint

    write_dataset(tmp_path / "data", n_train=40, n_val=16)
    params = write_params(tmp_path / "params.yaml")
    argv = ["--model", "toy", "--params", str(params), "--data", str(tmp_path / "data")]
    assert pairs_main(argv + ["--metrics", str(tmp_path / "metrics/pairs")]) == 0
    save_checkpoint(
        tiny_ranker,
        tokenizer,
        tmp_path / "models/toy/pairwise",
        method="pairwise",
        max_length=32,
        encoder="tiny-random-bert",
        trained_on={"model": "toy", "members": ["toy"]},
    )
    return tmp_path


def _blend(root, **over):
    from pipeline.blend import run

    params = params_section("blend", **{"predictors": {"toy": "pairwise"}, "features": "tfidf", **over})
    params["tfidf"] = {**params["tfidf"], "min_df": 1}
    return run(
        "toy",
        params,
        data_root=root / "data",
        models_root=root / "models",
        metrics_dir=root / "metrics/blend",
        plots_dir=root / "plots/blend",
    )


def test_blend_chooses_on_val_and_serves_what_it_chose(toy_models):
    import pandas as pd

    from pipeline.ranking.metrics import kendall_tau_b
    from pipeline.serving.scorer import Scorer, score_together

    facts = _blend(toy_models)
    dst = toy_models / "models/toy/pairwise+tfidf"
    meta = json.loads((dst / META).read_text())
    assert meta["method"] == "pairwise+tfidf" and meta["lexical"]["w"] == facts["w"]
    # the lexical model ranks the toy prompts, the random encoder does not: the blend leans lexical
    assert facts["lexical_val_tau_b"] > 0.6 > facts["encoder_val_tau_b"]
    assert facts["w"] < 0.5 and facts["val_tau_b"] >= facts["lexical_val_tau_b"]
    assert [r["encoder_weight"] for r in facts["encoder_weight_grid"]] == params_section("blend")["encoder_weights"]
    assert (toy_models / "metrics/blend/toy.json").is_file() and (toy_models / "plots/blend/toy.png").is_file()

    prompts = pd.read_parquet(toy_models / "data/prompts/prompts.parquet")
    test = prompts[prompts["split"] == "test"]["prompt"].tolist()
    source, blended = Scorer.from_pretrained(toy_models / "models/toy/pairwise"), Scorer.from_pretrained(dst)
    lexical = TfidfRidge.load(dst, ngram_max=meta["lexical"]["ngram_max"])
    expected = meta["lexical"]["encoder_weight"] * source.score(test) + meta["lexical"][
        "lexical_weight"
    ] * lexical.predict(test)
    np.testing.assert_allclose(blended.score(test), expected, rtol=1e-4, atol=1e-5)
    # beside its source, the blend shares the encoder's layers and still adds its lexical part
    together = score_together([source, blended], test)
    np.testing.assert_allclose(together[0], source.score(test), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(together[1], blended.score(test), rtol=1e-4, atol=1e-5)
    lengths = np.array([300.0 if "essay" in t else 40.0 for t in test])
    assert kendall_tau_b(blended.score(test), lengths) > 0.6
    # a prompt that reaches the server decomposed (NFD) and padded scores as the stored (NFC) one:
    # the lexical prior would otherwise see other words ("café" NFD splits into "caf" and an accent)
    import unicodedata

    from pipeline.serving.scorer import as_stored

    accented = ["écris un essai détaillé sur le café", "résumé: oui"]
    raw = [" " + unicodedata.normalize("NFD", t) + "\n" for t in accented]
    assert as_stored(raw) == accented
    french = TfidfRidge.fit_grid(accented, [300.0, 40.0], alphas=[1.0], ngram_max=1, min_df=1)[0]
    assert french.predict(raw).tolist() != french.predict(accented).tolist()  # why it matters
    accent = Scorer.from_pretrained(dst)
    accent.lexical = (french, *accent.lexical[1:])  # a lexical part that knows these words
    np.testing.assert_array_equal(accent.score(raw), accent.score(accented))
    np.testing.assert_array_equal(score_together([source, accent], raw)[1], accent.score(accented))
    # the same lexical model in two checkpoints predicts once; the same tokenizer tokenizes once
    from pipeline.serving.scorer import shared_lexical_predictions, shared_token_ids

    twin = Scorer.from_pretrained(dst)
    shared = shared_lexical_predictions([blended, source, twin], test)
    assert shared[1] is None and shared[0] is shared[2]
    np.testing.assert_allclose(shared[0], lexical.predict(test))
    other = TfidfRidge.fit_grid(test, lengths, alphas=[1.0], ngram_max=1, min_df=1)[0]
    assert lexical.same_as(twin.lexical[0]) and not lexical.same_as(other)
    ids = shared_token_ids([source, blended, twin], test)
    assert ids[0] is ids[1] is ids[2] and ids[0] == source.encode(test)

    # a predictor params do not name is refused; a tampered lexical file stops loading
    with pytest.raises(KeyError, match="predictors"):
        _blend(toy_models, predictors={"other": "pairwise"})
    (dst / WEIGHTS_FILE).write_bytes((dst / WEIGHTS_FILE).read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(CheckpointError, match=WEIGHTS_FILE):
        Scorer.from_pretrained(dst)


def test_blend_settings_and_lexical_meta_are_checked(toy_models):
    from pipeline.serving.scorer import Scorer

    with pytest.raises(ValueError, match="encoder_weights"):
        _blend(toy_models, encoder_weights=[0.5, 1.5])
    _blend(toy_models)
    dst = toy_models / "models/toy/pairwise+tfidf"
    meta = json.loads((dst / META).read_text())
    for bad, match in (
        ({**meta["lexical"], "encoder_weight": float("nan")}, "finite"),
        ({**meta["lexical"], "ngram_max": 0}, "ngram_max"),
        ("tfidf", "not an object"),
    ):
        (dst / META).write_text(json.dumps({**meta, "lexical": bad}))
        with pytest.raises(CheckpointError, match=match):
            Scorer.from_pretrained(dst)


def test_a_source_whose_pars_json_is_not_what_blend_reads_is_refused(toy_models, monkeypatch):
    from pipeline.serving.scorer import Scorer

    monkeypatch.setattr(Scorer, "score", lambda *a, **k: pytest.fail("scored a checkpoint it should refuse"))
    meta_file = toy_models / "models/toy/pairwise" / META
    meta = json.loads(meta_file.read_text())
    for bad, match in (
        ([], "pars.json holds a JSON list, not an object"),
        ({**meta, "trained_on": ["toy"]}, r"pars.json trained_on \['toy'\]: expected a mapping"),
        ({**meta, "trained_on": {"members": "toy"}}, "pars.json trained_on.members 'toy': expected a list"),
    ):
        meta_file.write_text(json.dumps(bad))
        with pytest.raises(CheckpointError, match=match):
            _blend(toy_models)
    assert not (toy_models / "models/toy/pairwise+tfidf").exists()


def test_a_decoder_head_that_is_not_a_name_is_named():
    from pipeline.blend import decoder_settings

    with pytest.raises(ValueError, match=r"blend.decoder.head \['pairwise'\]: expected one of"):
        decoder_settings(_decoder_settings("models/base/x", head=["pairwise"]), machine=False)


def test_evaluate_names_blended_predictors_as_model_and_method():
    from pipeline.errors import PARSError
    from pipeline.ranking.predictors import evaluated_predictors

    params = {"train_models": ["a"], "methods": ["pairwise"], "cross_models": ["r"], "blends": ["r/pairwise+tfidf"]}
    assert evaluated_predictors(params) == [("a", "pairwise"), ("r", "pairwise"), ("r", "pairwise+tfidf")]
    with pytest.raises(PARSError, match="blends"):
        evaluated_predictors({**params, "blends": ["r"]})


def test_decoder_features_are_deterministic_and_batch_independent(tiny_decoder):
    from pipeline.ranking.decoder import DecoderFeatures, DecoderPrior, DecoderRidge, cut_ids

    assert cut_ids(list(range(10)), 4) == [0, 1, 8, 9] and cut_ids([1, 2], 4) == [1, 2]
    features = DecoderFeatures.load(tiny_decoder, [1, 3], max_length=16)
    assert len(features.model.layers) == 4 and features.width == 2 * 2 * 32
    texts = TEXTS + ["a much longer prompt " * 20]
    x = features.embed(texts, batch_size=3)
    assert x.shape == (len(texts), features.width) and np.isfinite(x).all()
    # left padding with the mask: a prompt's features do not depend on its batch-mates
    np.testing.assert_allclose(features.embed(texts[:1], batch_size=1)[0], x[0], rtol=2e-2, atol=2e-2)
    ridge = DecoderRidge.fit_grid(x, LENGTHS + [900.0], alphas=[1.0, 1e4])
    assert np.abs(ridge[1].coef).sum() < np.abs(ridge[0].coef).sum()  # alpha shrinks
    prior = DecoderPrior(features, ridge[0])
    assert prior.predict([]).shape == (0,)
    with pytest.raises(ValueError, match="layer"):
        DecoderFeatures.load(tiny_decoder, [4], max_length=16)


def test_decoder_features_read_the_shared_prefix_from_a_cache_as_if_read_whole(tiny_decoder):
    """The chat template's shared prefix is run once and its keys/values reused (prefix caching):
    each prompt's features match reading it whole, alone, on the cached path and on the fallback path
    of a prompt that does not start with the prefix."""
    import torch

    from pipeline.ranking.decoder import DecoderFeatures

    features = DecoderFeatures.load(tiny_decoder, [1, 3], max_length=16)
    features.model.float()  # exact up to float32 rounding (bfloat16 where native would round more)
    texts = TEXTS + ["a much longer prompt " * 20]
    encoded = features.encode(texts)
    prefix = features.shared_prefix()
    assert prefix and all(e[: len(prefix)] == prefix for e in encoded)  # "user :" of the template
    with torch.inference_mode():
        whole = np.concatenate([features._forward([e], None) for e in encoded])
    np.testing.assert_allclose(features.embed(texts, batch_size=3), whole, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(features.embed(texts, batch_size=3, prefix_cache=False), whole, rtol=1e-4, atol=1e-5)
    # a longer prefix that only the first prompt starts with: it alone is read from the cache
    features._shared_prefix = encoded[0][: len(prefix) + 1]
    assert sum(e[: len(prefix) + 1] == encoded[0][: len(prefix) + 1] for e in encoded) < len(encoded)
    np.testing.assert_allclose(features.embed(texts, batch_size=3), whole, rtol=1e-4, atol=1e-5)


def test_a_qwen2_decoder_cut_to_its_read_layers_saves_and_loads_the_same(tmp_path, tokenizer):
    """Qwen2 configs list an attention kind per layer (`layer_types`), which must shrink with the layers
    kept, or the cut decoder cannot be saved into a blend checkpoint (the default blend reads Qwen2.5)."""
    import copy

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from pipeline.ranking.decoder import DecoderFeatures

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
    )
    assert len(config.layer_types) == 4
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "qwen", safe_serialization=True)
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{% for m in messages %}user: {{ m['content'] }}\n{% endfor %}assistant:"
    tok.save_pretrained(tmp_path / "qwen")

    cut = DecoderFeatures.load(tmp_path / "qwen", [1], max_length=16)
    assert len(cut.model.layers) == 2 and cut.model.config.layer_types == config.layer_types[:2]
    cut.save(tmp_path / "saved")
    again = DecoderFeatures.load(tmp_path / "saved", [1], max_length=16)
    np.testing.assert_array_equal(again.embed(TEXTS), cut.embed(TEXTS))


def test_decoder_blend_chooses_on_val_and_serves_what_it_chose(toy_models, tiny_decoder):
    import pandas as pd

    from pipeline.ranking.decoder import SUBDIR
    from pipeline.serving.scorer import Scorer, score_together

    decoder = {
        "path": str(tiny_decoder),
        "layers": [1, 2],
        "max_length": 32,
        "alphas": [1.0, 100.0],
        "max_train_prompts": 30,
        "batch_size": 8,
    }
    facts = _blend(toy_models, features="decoder", decoder=decoder)
    dst = toy_models / "models/toy/pairwise+decoder"
    meta = json.loads((dst / META).read_text())
    assert meta["method"] == "pairwise+decoder" and meta["decoder"]["w"] == facts["w"]
    assert facts["n_decoder_train_prompts"] == 30 and facts["alpha"] in (1.0, 100.0)
    assert facts["val_tau_b"] >= max(facts["encoder_val_tau_b"], facts["decoder_val_tau_b"]) - 1e-9
    # the truncated decoder travels with the checkpoint: 3 layers kept (deepest read + 1)
    assert json.loads((dst / SUBDIR / "config.json").read_text())["num_hidden_layers"] == 3

    prompts = pd.read_parquet(toy_models / "data/prompts/prompts.parquet")
    test = prompts[prompts["split"] == "test"]["prompt"].tolist()
    source, blended = Scorer.from_pretrained(toy_models / "models/toy/pairwise"), Scorer.from_pretrained(dst)
    prior, score_weight, decoder_weight = blended.decoder
    expected = score_weight * source.score(test) + decoder_weight * prior.predict(test)
    np.testing.assert_allclose(blended.score(test), expected, rtol=1e-3, atol=1e-3)
    # scored beside its source (evaluate), or batch by batch (the scheduler's worker): the same scores
    together = score_together([source, blended], test)
    np.testing.assert_allclose(together[1], blended.score(test), rtol=1e-3, atol=1e-3)
    parts = np.empty(len(test), dtype=np.float32)
    for rows, scores in blended.score_parts(test, batch_size=2):
        parts[rows] = scores
    np.testing.assert_allclose(parts, blended.score(test), rtol=1e-2, atol=2e-2)

    # an unknown feature kind or a bad setting names its key; a tampered decoder file stops loading
    with pytest.raises(ValueError, match="features"):
        _blend(toy_models, features="bag")
    with pytest.raises(ValueError, match="decoder.layers"):
        _blend(toy_models, features="decoder", decoder={**decoder, "layers": []})
    # the ridge's train prompts limited to some datasets: none of them there is one line, not a fit on nothing
    with pytest.raises(ValueError, match=r"decoder.datasets \['nowhere'\]: 0 train prompt"):
        _blend(toy_models, features="decoder", decoder={**decoder, "datasets": ["nowhere"]})
    with pytest.raises(ValueError, match="decoder.datasets 'toy'"):
        _blend(toy_models, features="decoder", decoder={**decoder, "datasets": "toy"})
    with pytest.raises(ValueError, match="decoder.path .*no such directory"):
        _blend(toy_models, features="decoder", decoder={**decoder, "path": str(toy_models / "models/base/none")})
    weights = dst / SUBDIR / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        Scorer.from_pretrained(dst)


def _tree(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_failed_acceptance_or_an_interruption_leaves_the_old_blend(toy_models, monkeypatch):
    """The regression is attached and the acceptance test run on a temp copy: a blend that does not
    score as chosen, or a stage stopped while attaching, never appears under the blend's name."""
    import pipeline.ranking.checkpoint as checkpoint

    dst = toy_models / "models/toy/pairwise+tfidf"
    real = checkpoint.attach_lexical

    def wrong_weight(out_dir, lexical, *, lexical_weight, **kwargs):  # serves another blend than chosen
        return real(out_dir, lexical, lexical_weight=2 * lexical_weight + 1, **kwargs)

    def interrupted(out_dir, *args, **kwargs):
        (out_dir / "half-written").write_text("")
        raise KeyboardInterrupt

    for none_before in (True, False):
        before = None if none_before else _tree(dst)
        for attach, error, match in (
            (wrong_weight, ValueError, "does not score as the blend chosen on val"),
            (interrupted, KeyboardInterrupt, None),
        ):
            monkeypatch.setattr(checkpoint, "attach_lexical", attach)
            with pytest.raises(error, match=match):
                _blend(toy_models)
            monkeypatch.undo()
            assert (None if none_before else _tree(dst)) == before and not (none_before and dst.exists())
            assert sorted(p.name for p in dst.parent.iterdir()) == ["pairwise"] + ([] if none_before else [dst.name])
        if none_before:
            _blend(toy_models)  # the good blend, kept by the failures that follow


def _decoder_settings(path, **over):
    return {
        "path": str(path),
        "layers": [1, 2],
        "max_length": 32,
        "alphas": [1.0],
        "max_train_prompts": 30,
        "batch_size": 8,
        **over,
    }


def test_a_bad_decoder_is_refused_before_any_scoring(toy_models, tiny_decoder, tokenizer, monkeypatch):
    """The decoder is loaded before the encoder scores the val prompts (minutes on real data): no chat
    template, fewer layers than `layers` reads, or layers not under `.layers` fail at once, naming
    blend.decoder.path."""
    import copy
    import shutil

    from transformers import GPT2Config, GPT2LMHeadModel

    from pipeline.serving.scorer import Scorer

    no_template = toy_models / "no_template"  # the tiny decoder without its chat template
    shutil.copytree(tiny_decoder, no_template)
    (no_template / "chat_template.jinja").unlink(missing_ok=True)
    untemplated = copy.deepcopy(tokenizer)
    untemplated.chat_template = None
    untemplated.save_pretrained(no_template)
    gpt2 = toy_models / "gpt2"  # its blocks are `.h`, not `.layers`
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=3, n_head=2)).save_pretrained(gpt2)
    for name in (
        "tokenizer_config.json",
        "chat_template.jinja",
        "vocab.txt",
        "tokenizer.json",
        "special_tokens_map.json",
    ):
        if (tiny_decoder / name).is_file():
            (gpt2 / name).write_bytes((tiny_decoder / name).read_bytes())

    monkeypatch.setattr(Scorer, "score", lambda *a, **k: pytest.fail("scored before the decoder was checked"))
    for settings, match in (
        (_decoder_settings(no_template), "no chat template"),
        (_decoder_settings(tiny_decoder, layers=[1, 4]), "has 4 layers"),
        (_decoder_settings(gpt2), "no `.layers` list"),
    ):
        with pytest.raises(ValueError, match=f"blend.decoder.path: .*{match}"):
            _blend(toy_models, features="decoder", decoder=settings)
    assert not (toy_models / "models/toy/pairwise+decoder").exists()


def test_the_pairwise_head_ranks_by_the_signal_and_loads_as_it_was_saved(tmp_path):
    """The decoder's pairwise head: PARS's pairwise loss on fixed features learns the length signal;
    its seeds' MLPs are averaged; the saved file predicts the same; a damaged file is one line."""
    from pipeline.ranking.decoder import DecoderMLPHead, DecoderPrior
    from pipeline.ranking.metrics import kendall_tau_b

    rng = np.random.default_rng(0)
    signal = rng.normal(size=1200)  # log length, seen by every feature through noise
    x = (signal[:, None] + rng.normal(size=(1200, 12))).astype(np.float32)
    lengths = np.expm1(np.clip(4.0 + signal + 0.3 * rng.normal(size=1200), 0.1, None))
    settings = {"epochs": 3, "hidden": 16, "lr": 3e-3, "batch_size": 64, "delta": 0.2, "margin": 0.0}
    settings["margin_per_log_length"] = 1.0
    head = DecoderMLPHead.fit(x[:1000], lengths[:1000], seeds=2, **settings)
    scores = head.predict(x[1000:])
    assert len(head.nets) == 2 and scores.shape == (200,)
    assert kendall_tau_b(scores, lengths[1000:]) > 0.6
    singles = [DecoderMLPHead(head.mean, head.scale, [net]).predict(x[1000:]) for net in head.nets]
    np.testing.assert_allclose(scores, np.mean(singles, 0), rtol=1e-5, atol=1e-6)
    assert not np.allclose(singles[0], singles[1])  # the seeds differ

    head.save(tmp_path / "head.safetensors")
    np.testing.assert_array_equal(DecoderMLPHead.load(tmp_path / "head.safetensors").predict(x[1000:]), scores)
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="bad.safetensors: decoder pairwise head could not be read"):
        DecoderMLPHead.load(tmp_path / "bad.safetensors")

    # the other losses train the same MLPs (the benchmark compares them); a checkpoint takes pairwise only
    listwise = DecoderMLPHead.fit(x[:1000], lengths[:1000], loss="listwise", seeds=1, **settings)
    assert listwise.loss == "listwise" and kendall_tau_b(listwise.predict(x[1000:]), lengths[1000:]) > 0.6
    with pytest.raises(ValueError, match="listwise loss: a checkpoint takes a ridge or a pairwise head"):
        DecoderPrior(None, listwise)
    with pytest.raises(ValueError, match="loss 'hinge'"):
        DecoderMLPHead.fit(x[:100], lengths[:100], loss="hinge", seeds=1, **settings)


def test_decoder_blend_with_a_pairwise_head_serves_what_it_chose(toy_models, tiny_decoder, monkeypatch):
    import pandas as pd

    from pipeline.ranking.decoder import PAIRWISE_HEAD_FILE, SUBDIR
    from pipeline.serving.scorer import Scorer

    pairwise = {"seeds": 2, "epochs": 2, "hidden": 8, "lr": 1e-3, "batch_size": 16, "delta": 0.2}
    pairwise |= {"margin": 0.0, "margin_per_log_length": 1.0}
    decoder = _decoder_settings(tiny_decoder, head="pairwise", pairwise_head=pairwise)
    del decoder["alphas"]  # a ridge's setting: a pairwise head needs none
    facts = _blend(toy_models, features="decoder", decoder=decoder)
    dst = toy_models / "models/toy/pairwise+decoder"
    meta = json.loads((dst / META).read_text())
    assert meta["decoder"]["head"] == "pairwise" and facts["alpha"] is None and facts["pairwise_head"] == pairwise
    assert (dst / SUBDIR / PAIRWISE_HEAD_FILE).is_file() and not (dst / SUBDIR / "ridge.safetensors").exists()
    assert facts["val_tau_b"] >= max(facts["encoder_val_tau_b"], facts["decoder_val_tau_b"]) - 1e-9

    prompts = pd.read_parquet(toy_models / "data/prompts/prompts.parquet")
    test = prompts[prompts["split"] == "test"]["prompt"].tolist()
    source, blended = Scorer.from_pretrained(toy_models / "models/toy/pairwise"), Scorer.from_pretrained(dst)
    prior, score_weight, decoder_weight = blended.decoder
    assert prior.head_kind == "pairwise"
    expected = score_weight * source.score(test) + decoder_weight * prior.predict(test)
    np.testing.assert_allclose(blended.score(test), expected, rtol=1e-3, atol=1e-3)

    # benchmarks/val_serving.py --blend-weights serves the blend re-weighted: W 1 is the order of its score
    # without the decoder prior (the source predictor's), W 0 its head's, the chosen W the checkpoint's
    import importlib.util

    import yaml

    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(benchmarks))
    spec = importlib.util.spec_from_file_location("val_serving", benchmarks / "val_serving.py")
    val_serving = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(val_serving)
    monkeypatch.chdir(toy_models)
    engine = dict(M=2000, chunk=64, token_budget=256, max_num_seqs=4, step_c0=0.01, starvation_s=None)
    (toy_models / "params.yaml").write_text(yaml.safe_dump({"simulate": {"engine": engine}}))
    w = meta["decoder"]["w"]
    argv = ["--model", "toy", "--predictors", "toy/pairwise,toy/pairwise+decoder", "--out", "vs.json"]
    assert val_serving.main(argv + ["--blend-weights", f"0,1,{w}", "--costliest", "0"]) == 0
    rows = json.loads((toy_models / "vs.json").read_text())["policies"]
    tau = {name: row["kendall_tau_b"] for name, row in rows.items()}
    assert tau["toy/pairwise+decoder (w 1)"] == pytest.approx(tau["toy/pairwise"], abs=1e-9)
    assert tau[f"toy/pairwise+decoder (w {w:g})"] == pytest.approx(tau["toy/pairwise+decoder"], abs=1e-9)
    assert tau["toy/pairwise+decoder (w 0)"] != pytest.approx(tau["toy/pairwise"], abs=1e-9)

    # a bad head setting names its key before anything is embedded
    with pytest.raises(ValueError, match=r"decoder.head 'mlp'"):
        _blend(toy_models, features="decoder", decoder={**decoder, "head": "mlp"})
    with pytest.raises(PARSError, match=r"decoder.pairwise_head.lr -1"):
        _blend(toy_models, features="decoder", decoder={**decoder, "pairwise_head": {**pairwise, "lr": -1}})
    with pytest.raises(ValueError, match=r"decoder: missing pairwise_head \(head: pairwise\)"):
        _blend(toy_models, features="decoder", decoder={k: v for k, v in decoder.items() if k != "pairwise_head"})
