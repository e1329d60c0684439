"""Unit checks of the benchmark scripts' bookkeeping (no engine, no training, no dvc)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """Import benchmarks/<name>.py as a module (engine_bench sets an env default: undone after)."""

    def load(name: str):
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"))
        monkeypatch.syspath_prepend(str(BENCHMARKS))
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


# -- engine_bench ----------------------------------------------------------------------------------
def test_engine_bench_stats_subtract_totals_only_and_max_is_the_bursts(bench):
    eb = bench("engine_bench")
    live = {"overhead_s": 1.0, "num_scored": 3, "max_overhead_s": 0.5, "last_overhead_s": 0.2}
    eb.reset_gauges(live)  # after the warm-up
    assert live == {"overhead_s": 1.0, "num_scored": 3, "max_overhead_s": 0.0, "last_overhead_s": 0.0}
    before = dict(live)
    live.update(overhead_s=1.25, num_scored=13, max_overhead_s=0.01, last_overhead_s=0.003)  # the burst
    stats = eb.burst_stats(before, live)
    assert stats == {"overhead_s": 0.25, "num_scored": 10, "max_overhead_s": 0.01, "last_overhead_s": 0.003}


def test_engine_bench_refuses_a_request_short_of_its_tokens(bench):
    eb = bench("engine_bench")
    eb.check_token_counts("pars", {"0": 5, "1": 7}, {"0": 5, "1": 7})
    with pytest.raises(RuntimeError, match=r"engine_bench pars: 1 request\(s\) .*request 1: 3 of 7 tokens"):
        eb.check_token_counts("pars", {"0": 5, "1": 3}, {"0": 5, "1": 7})


@pytest.mark.parametrize("n", ["0", "-1"])
def test_engine_bench_refuses_fewer_than_one_prompt_naming_the_flag(bench, capsys, n):
    eb = bench("engine_bench")
    assert eb.parse_args(["--num-prompts", "1"]).num_prompts == 1
    with pytest.raises(SystemExit) as exc:  # not the whole split (hours of vLLM)
        eb.parse_args(["--num-prompts", n])
    assert exc.value.code == 2
    assert f"argument --num-prompts: must be at least 1, got {n}" in capsys.readouterr().err


# -- engine_draws ----------------------------------------------------------------------------------
def test_engine_draws_unscored_requests_wait_at_the_typical_score(bench, monkeypatch, tmp_path):
    import transformers

    import pipeline.queueing.simulator as simulator
    import pipeline.serving.scorer as scorer_mod

    ed = bench("engine_draws")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "pars.json").write_text("{}")
    fidelity = tmp_path / "fidelity.json"
    engine = {"M": 4096, "chunk": 256, "token_budget": 256, "max_num_seqs": 2, "block_size": 16}
    fidelity.write_text(
        json.dumps(
            {
                "scoring_rate_prompts_per_s": 5.0,
                "engine": engine,
                "step_model": {"c0_s": 0.01, "c1_s_per_token": 0.001},
            }
        )
    )
    rng = np.random.default_rng(0)
    workload = [
        {"prompt_id": f"p{i}", "prompt": f"prompt {i}", "ids": [1] * int(rng.integers(5, 40)), "length": int(n)}
        for i, n in enumerate(rng.integers(1, 60, 12))
    ]

    class FakeScorer:
        typical_score = 3.5

        def score(self, texts):
            return [float(t.split()[1]) for t in texts]

    calls = []
    real = simulator.simulate

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(simulator, "simulate", spy)
    monkeypatch.setattr(scorer_mod.Scorer, "from_pretrained", classmethod(lambda cls, path: FakeScorer()))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: object())
    monkeypatch.setattr(ed, "read_split", lambda *a: None)
    monkeypatch.setattr(ed, "draw_workload", lambda frame, draw, tok, ids: workload[: draw.num_prompts])
    out = tmp_path / "draws.json"
    argv = ["--checkpoint", str(checkpoint), "--fidelity", str(fidelity), "--sizes", "10", "--draws", "2"]
    assert ed.main([*argv, "--out-json", str(out), "--plot", str(tmp_path / "draws.png")]) == 0
    pars = [c for c in calls if c.get("key_ready") is not None]
    assert len(pars) == 2 and all(c["first_provisional"] == 3.5 and c["sort_running"] for c in pars)
    assert sum(c.get("sort_running", False) for c in calls) == 4  # pars and oracle, each draw
    assert json.loads(out.read_text())["first_provisional_score"] == 3.5


# -- cold_repro ------------------------------------------------------------------------------------
def _events(lines):
    return [(float(t), f"{text}\n") for t, text in lines]


def test_cold_repro_times_ran_skipped_and_restored_stages_apart(bench):
    cr = bench("cold_repro")
    events = _events(
        [
            (1, "Running stage 'prepare':"),
            (2, "> pars prepare"),
            (10, "Stage 'lengths' didn't change, skipping"),
            (11, "'data/raw.dvc' didn't change, skipping"),
            (12, "Stage 'train@x' is cached - skipping run, checking out outputs"),
            (15, "Running stage 'evaluate':"),
        ]
    )
    out = cr.summary(events, 20.0)
    assert out["stages_s"] == {"prepare": 9.0, "evaluate": 5.0}  # prepare ends at the next stage line
    assert out["skipped"] == ["lengths", "data/raw.dvc"] and "in git" in out["skipped_why"]
    assert out["restored_s"] == {"train@x": 3.0} and out["cold"] is False
    assert "benchmarks/engine_bench.py" in out["not_in_repro"] and "unrecognised" not in out


def test_cold_repro_flags_a_stage_line_it_does_not_know(bench):
    cr = bench("cold_repro")
    out = cr.summary(_events([(1, "Running stage 'a':"), (4, "Stage 'b' did something new"), (6, "x")]), 9.0)
    assert out["stages_s"] == {"a": 3.0} and out["unrecognised"] == ["Stage 'b' did something new"]
    assert cr.summary(_events([(1, "Running stage 'a':")]), 2.0)["cold"] is True


# -- train_throughput ------------------------------------------------------------------------------
def test_train_throughput_pools_repeats_consistently(bench):
    tt = bench("train_throughput")
    run = {"config": "c", "steps": 60, "prompts_encoded": 600, "pairs": 1000, "train_s": 10.0}
    run.update(prompts_per_s=60.0, pairs_per_s=100.0, cache_s=2.0, epoch_prompts=300, val_tau_b=0.4)
    other = {**run, "steps": 60, "prompts_encoded": 600, "pairs": 1000, "train_s": 20.0, "prompts_per_s": 30.0}
    row = tt.pooled([run, other])
    assert (row["steps"], row["prompts_encoded"], row["pairs"], row["train_s"]) == (120, 1200, 2000, 30.0)
    assert row["prompts_per_s"] == 40.0 and row["pairs_per_s"] == round(2000 / 30, 2)
    assert row["steps_runs"] == [60, 60] and row["prompts_per_s_runs"] == [60.0, 30.0] and row["runs"] == 2
    single = tt.pooled([run])
    assert single["steps"] == 60 and single["prompts_encoded"] == 600 and single["runs"] == 1


# -- seed_spread -----------------------------------------------------------------------------------
def test_seed_spread_retrains_when_any_train_setting_changed(bench, monkeypatch, tmp_path):
    ss = bench("seed_spread")
    ckpt = tmp_path / "seed1" / "toy" / "pairwise"
    ckpt.mkdir(parents=True)
    cfg = {"lr": 1e-4, "seed": 1, "max_length": 16, "encoder": "tiny", "epochs": 2, "pooling": "cls"}
    cfg["lexical_prior"] = {"ngram_max": 2, "folds": 5}
    cfg["wandb"] = {"project": "pars"}
    meta = {"training": {"lr": 1e-4, "seed": 1}, "max_length": 16, "encoder": "tiny"}
    monkeypatch.setattr(ss, "read_meta", lambda path: meta)
    assert ss.stale(ckpt, cfg)  # no stored train section: which settings made it is unknown
    ss.write_json(ss.settings(cfg), ss.settings_path(ckpt))
    assert ss.settings_path(ckpt).name == "pairwise.train.json"
    assert not ss.stale(ckpt, cfg)
    assert not ss.stale(ckpt, {**cfg, "wandb": {"project": "other"}})  # logging only
    assert ss.stale(ckpt, {**cfg, "epochs": 3})  # not in pars.json's record
    assert ss.stale(ckpt, {**cfg, "lexical_prior": {"ngram_max": 2, "folds": 3}})
    assert ss.stale(ckpt, {**cfg, "lr": 2e-4})  # in pars.json's record


def test_attained_service_flags_only_a_decile_that_overtakes_the_next(bench):
    """Preempting on expected remaining answer pays only where a running request comes to expect more
    than the next decile up expects at its start: a long tail among the shortest-predicted does that,
    lengths that shrink as they run do not."""
    attained = bench("attained_service")
    rng = np.random.default_rng(0)
    scores = np.arange(1000.0)  # decile d holds scores 100 (d - 1) .. 100 d - 1
    even = np.repeat(np.arange(1, 11) * 50, 100) + rng.integers(0, 20, 1000)  # decile d: about 50 d tokens
    rising, overtaken = attained.judge(attained.mean_remaining(even, scores))
    assert overtaken == []
    tail = even.copy()
    tail[:100] = np.where(np.arange(100) < 90, 3, 600)  # decile 1: most answers of 3 tokens, a tenth of 600
    table = attained.mean_remaining(tail, scores)
    assert table["1"]["0"] < table["2"]["0"] < table["1"]["25"]  # starts shortest, then expects more than decile 2
    rising, overtaken = attained.judge(table)
    assert 1 in rising and overtaken == [1]
    assert attained._spans({1, 2, 3, 5, 7, 8}) == "1-3, 5, 7-8" and attained._spans(set()) == "none"


# -- reply_targets ---------------------------------------------------------------------------------
def test_reply_targets_embeds_answers_and_adds_the_weighted_term(bench, tiny_encoder_dir):
    """Answer embeddings: one unit vector per answer, the same text the same vector. The training step
    is the pipeline's loss plus weight x the cosine distance of the mapped pooled vector to each
    prompt's answer embedding (a prompt without one adds nothing)."""
    import torch

    from pipeline.ranking.model import LengthRanker, encode_prompts, load_tokenizer, pad_batch

    rt = bench("reply_targets")
    emb = rt.answer_embeddings(
        ["a short answer", "def f():\n    return 1", "a short answer"], str(tiny_encoder_dir), 16
    )
    assert emb.shape[0] == 3 and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert np.allclose(emb[0], emb[2]) and not np.allclose(emb[0], emb[1])

    tok = load_tokenizer(str(tiny_encoder_dir))
    ids, mask = pad_batch(encode_prompts(tok, ["why", "write a long essay", "hi"], 16), tok.pad_token_id)
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "lengths": torch.tensor([50.0, 900.0, 5.0]),
        "truncated": torch.zeros(3, dtype=torch.bool),
        "pairs": torch.tensor([[0, 1], [2, 0]]),
        "index": torch.tensor([0, 1, 2]),
    }
    targets = {"p0": emb[0], "p1": emb[1]}  # p2 has no answer embedding
    losses = {}
    for weight in (0.0, 3.0):
        torch.manual_seed(0)
        model = LengthRanker.from_pretrained_encoder(str(tiny_encoder_dir), dropout=0.0)
        module = rt.aux_module(targets, weight)(model, "pairwise", margin=0.0, margin_per_log_length=1.0)
        module._target = torch.as_tensor(np.stack([emb[0], emb[1], np.zeros_like(emb[0])]))
        module._has = torch.tensor([True, True, False])
        losses[weight] = float(module.training_step(batch, 0).detach())
        with torch.no_grad():
            pooled = model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state[:2, 0]
            aux = (1 - torch.nn.functional.cosine_similarity(module.aux_head(pooled), module._target[:2])).mean()
    assert losses[3.0] - losses[0.0] == pytest.approx(3.0 * float(aux), rel=1e-4, abs=1e-6)


def test_reply_targets_reader_targets_are_unit_principal_components(bench):
    """--target decoder: each prompt's decoder features become a unit vector of `dim` principal
    components; the same features the same vector; a dim beyond the data held is refused."""
    rt = bench("reply_targets")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 12)).astype(np.float32)
    x[:, 0] *= 1.0 + 9.0 * (np.arange(60) % 2)  # even rows small, odd rows large on feature 0
    x[7] = x[3]
    z, kept = rt.reader_target_vectors(x, 4)
    assert 4 / 12 < kept < 1 and z.shape == (60, 4) and np.allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)
    assert np.allclose(z[7], z[3]) and not np.allclose(z[3], z[4])
    with pytest.raises(ValueError, match="--target-dim 13"):
        rt.reader_target_vectors(x, 13)


# -- decoder_features ------------------------------------------------------------------------------
def test_decoder_features_cache_gives_the_rows_and_layers_asked_and_the_cross_fit_never_picks_on_its_scored_half(
    bench, tmp_path
):
    df = bench("decoder_features")
    rng = np.random.default_rng(0)
    # a cache of 3 layers (width 4 each: last position + mean of a 2-wide toy decoder), 5 prompts
    feats = rng.normal(size=(5, 12)).astype(np.float32)
    ids = ["a", "b", "c", "d", "e"]

    def write_cache(path, decoder, fingerprint):
        np.savez(
            path,
            features=feats,
            layers=np.array([2, 4, 6]),
            prompt_ids=np.array(ids),
            decoder=str(decoder),
            decoder_fingerprint=fingerprint,
            max_length=64,
            embed_s=1.5,
            dtype="bfloat16",
        )

    cache = tmp_path / "cache.npz"
    write_cache(cache, "dec", df.decoder_fingerprint("dec"))
    got, rate, dtype, source = df.features_of("dec", [2, 6], 64, 16, ["d", "a"], ["text d", "text a"], str(cache))
    np.testing.assert_array_equal(got, feats[[3, 0]][:, [0, 1, 2, 3, 8, 9, 10, 11]])
    assert (rate, dtype) == (5 / 1.5, "bfloat16") and str(cache) in source
    # a decoder directory is known by its files: other weights at the same path are another decoder
    model = tmp_path / "decoder"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights one")
    before = df.decoder_fingerprint(model)
    (model / "model.safetensors").write_bytes(b"weights two")
    assert df.decoder_fingerprint(model) != before and df.decoder_fingerprint(model) == df.decoder_fingerprint(model)
    stale = tmp_path / "stale.npz"
    write_cache(stale, model, before)
    with pytest.raises((OSError, ValueError)):  # not answered from the stale cache: read afresh, and this is no model
        df.features_of(str(model), [2], 64, 16, ["a"], ["text a"], str(stale))
    # another max_length (or a prompt, a layer the cache lacks): computed afresh, here from a decoder
    # that does not exist, so it fails instead of answering from the cache
    with pytest.raises((OSError, ValueError)):
        df.features_of(str(tmp_path / "no-decoder"), [2], 128, 16, ["a"], ["text a"], str(cache))

    # a candidate that is pure noise next to a perfect checkpoint: both halves keep the checkpoint
    y = np.expm1(rng.uniform(1, 6, size=400))
    combined = df.cross_fit_combination(np.log1p(y), {"noise": rng.normal(size=400)}, y, [0.0, 0.5, 1.0])
    assert [c["checkpoint_weight"] for c in combined["chosen"]] == [1.0, 1.0]
    assert combined["val_tau_b"] == pytest.approx(1.0)


def test_decoder_pooling_keeps_each_prompts_own_token_states_and_the_pooled_heads_learn(bench, tiny_decoder):
    import torch

    from pipeline.ranking.decoder import DecoderFeatures

    dp = bench("decoder_pooling")
    reader = DecoderFeatures.load(tiny_decoder, [1, 3], max_length=16)
    texts = ["say hi", "a much longer prompt " * 9, "explain rome in detail", "hi", "write a long essay about rome"]
    feats, offsets, states = dp.read_token_states(reader, [1, 3], texts, batch_size=2)
    np.testing.assert_allclose(feats, reader.embed(texts), atol=1e-3)  # the reader's own features (bf16 where native)
    n_prefix = len(reader.shared_prefix())
    width = 32  # the tiny decoder's hidden size
    lasts = []
    for i, e in enumerate(reader.encode(texts)):
        own = states[offsets[i] : offsets[i + 1]].float().numpy()
        assert len(own) == len(e) - n_prefix  # its tokens after the cached prefix, no padding
        for part in range(2):  # per layer read: [last position, mean]; the states: the layers side by side
            np.testing.assert_allclose(
                own[-1, part * width : (part + 1) * width],
                feats[i, 2 * part * width : (2 * part + 1) * width],
                atol=2e-3,
            )
        lasts.append(own[-1])
    assert min(np.abs(a - b).max() for a, b in zip(lasts, lasts[1:])) > 0.01  # the check tells prompts apart
    stats = dp.pooled_statistics(states, offsets)
    assert sorted(stats) == sorted(dp.STATISTICS) and all(v.shape == (len(texts), 2 * width) for v in stats.values())
    first = states[offsets[0] : offsets[1]].float()
    np.testing.assert_allclose(stats["max"][0], first.max(0).values.numpy())
    np.testing.assert_allclose(stats["last-12 mean"][0], first[-12:].mean(0).numpy(), rtol=1e-5, atol=1e-7)

    # the attention head learns a length that its tokens carry: a marker token's count
    rng = np.random.default_rng(0)
    n_prompts, d = 200, 4
    lengths = rng.integers(1, 30, n_prompts)
    toks = [
        np.hstack([np.eye(2)[(np.arange(k) < m).astype(int)], rng.normal(size=(k, d - 2))])
        for k, m in zip(rng.integers(12, 20, n_prompts), np.minimum(lengths // 3, 11))
    ]
    offs = np.cumsum([0] + [len(t) for t in toks])
    y = np.expm1(lengths / 5.0)
    cfg = dict(seeds=2, epochs=20, hidden=16, lr=3e-3, batch_size=32, delta=0.2, margin=0.0, margin_per_log_length=1.0)
    train, val = np.arange(150), np.arange(150, n_prompts)
    score = dp.fit_attention_heads(
        torch.tensor(np.vstack(toks), dtype=torch.bfloat16),
        offs,
        rng.normal(size=(n_prompts, 3)).astype(np.float32),
        y,
        np.zeros(n_prompts, bool),
        train,
        val,
        cfg,
    )
    from pipeline.ranking.metrics import kendall_tau_b

    assert score.shape == (50,) and kendall_tau_b(score, y[val]) > 0.5


def test_decoder_head_settings_come_from_params_and_a_missing_section_is_one_line(bench, tmp_path, monkeypatch, capsys):
    df = bench("decoder_features")
    cfg = df.head_settings()  # the repository's params.yaml: the blend's head, whole
    assert set(cfg) == {"seeds", "epochs", "hidden", "lr", "batch_size", "delta", "margin", "margin_per_log_length"}
    bad = tmp_path / "params.yaml"
    bad.write_text("blend:\n  decoder: {path: x}\n")
    monkeypatch.setenv("PARS_PARAMS", str(bad))
    with pytest.raises(SystemExit) as exc:
        df.head_settings()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "blend.decoder.pairwise_head" in err and "\n" not in err


@pytest.mark.parametrize(
    "name, flag",
    [
        ("decoder_features", "--alphas"),
        ("serving_key", "--gammas"),
        ("distill_labels", "--layers"),
        ("decoder_prior", "--layers"),
    ],
)
def test_decoder_benchmarks_read_number_lists_and_a_bad_one_is_an_error_naming_its_flag(bench, name, flag, capsys):
    from pipeline.cli import comma_numbers

    assert comma_numbers(int)("8,12, 16,") == [8, 12, 16]
    assert comma_numbers(float)("3e3,1") == [3000.0, 1.0]
    argv = ["--out", "unused"] if name == "distill_labels" else []
    with pytest.raises(SystemExit) as exc:  # before anything is read or computed
        bench(name).main([*argv, flag, "8,x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "'8,x'" in err and "Traceback" not in err
    with pytest.raises(SystemExit):  # a layer below 1 is refused by each of them alike
        bench(name).main([*argv, "--layers", "0,8"])
    assert "argument --layers: '0,8': expected comma-separated int values >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("name, flag", [("decoder_features", "--head-losses"), ("decoder_prior", "--priors")])
def test_decoder_benchmarks_read_name_lists_and_a_bad_name_is_an_error_naming_its_flag(bench, name, flag, capsys):
    from pipeline.cli import comma_names

    assert comma_names(("a", "b"))(" b,a,") == ["b", "a"]
    for bad in ("pairwise,bogus", ","):
        with pytest.raises(SystemExit) as exc:  # before anything is read or computed
            bench(name).main([flag, bad])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: {bad!r}: expected comma-separated names from" in err and "Traceback" not in err


def test_decoder_prior_is_calibrated_to_log_length_on_train_and_applied_to_val(bench):
    dp = bench("decoder_prior")
    rng = np.random.default_rng(0)
    lengths = np.expm1(rng.uniform(1, 6, size=300))
    score = 2.0 * np.log1p(lengths) - 3.0  # a head whose scale and offset are not log length's
    train_prior, val_prior, coef = dp.calibrated_prior([score], [np.array([-3.0, 1.0])], lengths)
    np.testing.assert_allclose(train_prior, np.log1p(lengths), atol=1e-9)
    np.testing.assert_allclose(coef, [0.5, 1.5], atol=1e-9)
    np.testing.assert_allclose(val_prior, [0.0, 2.0], atol=1e-9)
    # a second part that carries nothing new gets no weight beside an exact one
    noise = rng.normal(size=300)
    _, _, coef = dp.calibrated_prior([score, noise], [score[:2], noise[:2]], lengths)
    assert coef[1] == pytest.approx(0.0, abs=1e-9)


# -- serving_key -----------------------------------------------------------------------------------
def test_serving_key_bins_give_each_bins_moments_and_the_head_learns_a_separable_length(bench):
    sk = bench("serving_key")
    o = np.array([1.0, 2.0, 4.0, 30.0, 50.0, 2000.0])
    m1, minv = sk.bin_moments(o)
    assert m1[0] == pytest.approx(1.5) and minv[0] == pytest.approx(0.75)  # (0, 2]: 1 and 2
    assert m1[4] == pytest.approx(30.0) and m1[5] == pytest.approx(50.0)  # (20, 40], (40, 70]
    assert m1[-1] == pytest.approx(2000.0) and m1[3] == pytest.approx(20.0)  # (10, 20] empty: its top edge

    # one feature says whether the answer is a word or a page: the head's E[1/o] must tell them apart
    rng = np.random.default_rng(0)
    short = rng.random(600) < 0.5
    x = np.c_[short.astype(np.float32), rng.normal(size=(600, 3)).astype(np.float32)]
    lengths = np.where(short, 2.0, 500.0)
    probs = sk.fit_bins(x, lengths, x[:4], seeds=1, epochs=30, hidden=16, lr=1e-2, batch_size=32)
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-6)
    m1, minv = sk.bin_moments(lengths)
    e_inv = probs @ minv
    assert all(e_inv[i] > 5 * e_inv[j] for i in np.flatnonzero(short[:4]) for j in np.flatnonzero(~short[:4]))


# -- distill_labels --------------------------------------------------------------------------------
def test_distill_labels_mixes_log_lengths_and_keeps_the_answer_at_alpha_one(bench):
    dl = bench("distill_labels")
    lengths = np.array([0.0, 9.0, 99.0])
    teacher = np.log1p(np.array([99.0, 99.0, 9.0]))
    np.testing.assert_allclose(dl.mixed_lengths(lengths, teacher, 1.0), lengths)
    np.testing.assert_allclose(dl.mixed_lengths(lengths, teacher, 0.0), [99.0, 99.0, 9.0])
    np.testing.assert_allclose(dl.mixed_lengths(lengths, teacher, 0.5), [9.0, np.sqrt(1000) - 1, np.sqrt(1000) - 1])


def test_reader_prefix_cache_agreement_is_one_for_equal_features_and_names_the_largest_difference(bench):
    mod = bench("reader_prefix_cache")
    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    same = mod.agreement(a, a.copy())
    assert same["cosine_min"] == 1.0 and same["max_abs_diff_over_max_abs"] == 0.0
    moved = mod.agreement(a, np.array([[1.0, 1.0], [0.0, 2.0]]))  # one row turned by 45 degrees
    assert moved["cosine_min"] == round(float(np.sqrt(0.5)), 6) and moved["max_abs_diff_over_max_abs"] == 0.5
    assert mod.main(["--n", "0"]) == 2


# -- entry points (pipeline.cli.run_script) --------------------------------------------------------
@pytest.mark.parametrize(
    "name, argv, named",
    [
        ("val_by_member", ["ck", "--params", "missing.yaml"], "missing.yaml"),
        ("score_throughput", ["--prompts", "missing.parquet"], "missing.parquet"),
        ("score_throughput", ["--prompts", "prompts.parquet", "--checkpoint", "broken"], "broken"),
        ("scorer_int8", ["--prompts-file", "prompts.parquet", "--models", "m", "--checkpoint", "broken"], "broken"),
        ("scheduler_overhead", ["--prompts", "missing.parquet"], "missing.parquet"),
        ("scheduler_overhead", ["--prompts", "prompts.parquet", "--served-model", "missing"], "--served-model missing"),
    ],
)
def test_a_benchmark_run_as_a_script_reports_a_missing_file_or_broken_checkpoint_in_one_line(
    name, argv, named, tmp_path, monkeypatch, capsys
):
    import runpy
    import sys

    import pandas as pd

    monkeypatch.chdir(tmp_path)
    pd.DataFrame({"prompt_id": ["a"], "prompt": ["hi"], "split": ["test"]}).to_parquet("prompts.parquet")
    (tmp_path / "broken").mkdir()  # a checkpoint without its pars.json
    (tmp_path / "broken" / "config.json").write_text("{}")
    (tmp_path / "data" / "generations" / "m").mkdir(parents=True)
    (tmp_path / "data" / "generations" / "m" / "generations.parquet").touch()
    monkeypatch.delenv("PARS_DEBUG", raising=False)
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # sys.path comes back as it was, the scripts' inserts undone
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    with pytest.raises(SystemExit) as exc:  # its `if __name__ == "__main__":`
        runpy.run_path(str(BENCHMARKS / f"{name}.py"), run_name="__main__")
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{name}: error: ") and named in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "name, flag, bad",
    [
        ("score_throughput", "--batch-sizes", ""),
        ("answer_caps", "--caps", "256,x"),
        ("reply_targets", "--weights", ","),
    ],
)
def test_benchmark_number_lists_are_argparse_errors_naming_their_flag(bench, name, flag, bad, monkeypatch, capsys):
    import sys

    module = bench(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", flag, bad])  # answer_caps reads sys.argv
    with pytest.raises(SystemExit) as exc:  # before anything is read or loaded
        module.main() if name == "answer_caps" else module.main([flag, bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {bad!r}: expected comma-separated" in err and "Traceback" not in err
