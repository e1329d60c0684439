"""evaluate + report: metrics on hand-made data, then the stage end to end on tiny random predictors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import params_section
from scipy.stats import kendalltau

from pipeline.contracts import GENERATIONS, PROMPTS, generations_path, prompts_path, write_table
from pipeline.ranking import metrics as M

DATASETS = ("ds_a", "ds_b", "ds_c")
ALPHAS = [0.3, 1.0, 3.0, 10.0]
TFIDF = {"ngram_max": 2, "min_df": 2, "alphas": ALPHAS, "min_train_prompts": 20}


def _labels(gens):
    from pipeline.ranking.labels import prompt_labels

    return prompt_labels(gens).set_index("prompt_id")


# ---------------------------------------------------------------- metrics on hand-made data


def test_kendall_tau_b_known_values():
    assert M.kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # one tie in x: tau_b = 5 / sqrt(5 * 6)
    assert M.kendall_tau_b([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / np.sqrt(30))
    assert M.kendall_tau_b([4, 3, 2, 1], [1, 2, 3, 4]) == pytest.approx(-1.0)
    assert np.isnan(M.kendall_tau_b([1, 1, 1], [1, 2, 3]))
    assert np.isnan(M.kendall_tau_b([1], [2]))


def test_bootstrap_interval_contains_estimate_and_is_paired():
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    y = x + rng.normal(size=200)

    def tau_ci(x, y):
        return M.kendall_tau_b(x, y), *M.percentile_ci(M.bootstrap_taus(x, y, M.bootstrap_indices(len(x), 300, 1)))

    tau, low, high = tau_ci(x, y)
    assert low < tau < high
    assert 0.3 < tau < 0.7 and high - low < 0.25
    # same (n, n_boot, seed) -> same resamples: the paired-bootstrap property evaluate relies on
    np.testing.assert_array_equal(M.bootstrap_indices(50, 10, 3), M.bootstrap_indices(50, 10, 3))
    # a narrower interval with more prompts
    _, big_low, big_high = tau_ci(np.tile(x, 4), np.tile(y, 4) + rng.normal(size=800) * 1e-6)
    assert big_high - big_low < high - low


def test_matrix_bootstrap_equals_scipy_on_every_resample():
    """The vectorised tau_b of resamples (ties, duplicates, degenerate resamples) is scipy's."""
    rng = np.random.default_rng(2)
    for n in (3, 40, 150):
        x = rng.integers(0, 8, n).astype(float)  # many ties
        y = x + rng.integers(0, 5, n)
        idx = M.bootstrap_indices(n, 120, seed=n)
        slow = np.array([kendalltau(x[i], y[i], variant="b").statistic for i in idx])
        np.testing.assert_allclose(M.bootstrap_taus(x, y, idx), slow, atol=1e-12, equal_nan=True)
    assert np.isnan(M.bootstrap_taus(np.ones(4), np.arange(4.0), M.bootstrap_indices(4, 5, 0))).all()


def test_pair_accuracy_delta_filter_truncation_and_ties():
    lengths = [100, 110, 200, 50]  # (100, 110) differs by 9% < delta: not a pair
    acc, n = M.delta_pair_accuracy([1, 2, 3, 0], lengths, delta=0.2)
    assert (acc, n) == (1.0, 5)
    acc, n = M.delta_pair_accuracy([0, 2, 3, 1], lengths, delta=0.2)  # 100 vs 50 misordered
    assert (acc, n) == (pytest.approx(4 / 5), 5)
    # the 50-token answer is a lower bound: every pair where it is the shorter side is dropped
    acc, n = M.delta_pair_accuracy([0, 2, 3, 1], lengths, [False, False, False, True], delta=0.2)
    assert (acc, n) == (1.0, 2)
    # a truncated *longer* side keeps its pairs (its true length is only longer)
    _, n = M.delta_pair_accuracy([0, 2, 3, 1], lengths, [False, False, True, False], delta=0.2)
    assert n == 5
    acc, _ = M.delta_pair_accuracy([1, 1, 1, 1], lengths, delta=0.2)  # equal scores count one half
    assert acc == 0.5
    assert M.delta_pair_accuracy([1, 2], [10, 10], delta=0.2) == (pytest.approx(np.nan, nan_ok=True), 0)


def test_pair_accuracy_in_blocks_equals_one_pass_over_every_kept_pair():
    from pipeline.ranking.labels import in_batch_pairs

    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(2, 120))
        lengths = rng.integers(0, 20, n).astype(float)  # ties, zeros and boundary ratios
        scores = rng.integers(0, 6, n).astype(float)  # tied scores count one half
        truncated = rng.random(n) < 0.2
        pairs = in_batch_pairs(lengths, truncated, 0.2)
        expected = (M.pair_accuracy(scores, lengths, pairs), len(pairs))
        got = M.delta_pair_accuracy(scores, lengths, truncated, delta=0.2, chunk_pairs=int(rng.integers(1, 400)))
        assert got[1] == expected[1] and (got[0] == expected[0] or np.isnan(expected[0]) and np.isnan(got[0]))


def test_harrell_c_known_values():
    # prompt:       A      B      C      D      E
    labels = [10, 20, 30, 50, 50]
    cut = [False, True, False, False, True]
    scores = [2.5, 3, 2, 2, 5]
    # comparable (labels differ, shorter uncut): A-B 1, A-C 0, A-D 0, A-E 1, C-D 1/2 (score tie), C-E 1;
    # B (cut) is the shorter of B-C, B-D, B-E: skipped; D-E tie in label: skipped; E cut but longer: kept
    assert M.harrell_c(labels, scores, cut) == (pytest.approx(3.5 / 6), 6)
    # uncut, B's three pairs come in: B-C 0, B-D 0, B-E 1 -> 4.5 / 9
    assert M.harrell_c(labels, scores, [False] * 5) == (pytest.approx(4.5 / 9), 9)
    assert M.harrell_c([10, 20], [1, 2], [True, False])[1] == 0  # the shorter is cut: no known order
    assert np.isnan(M.harrell_c([10, 20], [1, 2], [True, False])[0])
    # no censoring: C = (1 + (concordant - discordant) / label-untied pairs) / 2, = (1 + tau_b) / 2 without ties
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=60), rng.normal(size=60)
    assert M.harrell_c(y, x, np.zeros(60, bool))[0] == pytest.approx((1 + M.kendall_tau_b(x, y)) / 2)
    yi, xi = rng.integers(0, 6, 60).astype(float), rng.integers(0, 6, 60).astype(float)
    i, j = np.triu_indices(60, k=1)
    untied = yi[i] != yi[j]
    p = (np.sign(xi[i] - xi[j]) * np.sign(yi[i] - yi[j]))[untied].sum()
    assert M.harrell_c(yi, xi, np.zeros(60, bool)) == (pytest.approx((1 + p / untied.sum()) / 2), untied.sum())


def test_harrell_c_bootstrap_is_harrell_c_of_each_resample_in_any_blocks():
    rng = np.random.default_rng(5)
    n = 30
    labels = rng.integers(0, 10, n).astype(float)  # label ties, and copies of a prompt in a resample
    scores = rng.integers(0, 5, n).astype(float)
    cut = rng.random(n) < 0.3
    idx = M.bootstrap_indices(n, 50, seed=1)
    slow = np.array([M.harrell_c(labels[r], scores[r], cut[r])[0] for r in idx])
    np.testing.assert_allclose(M.bootstrap_harrell_c(labels, scores, cut, idx), slow, atol=1e-12)
    counts = M.resample_counts(idx, n)
    for block in (1, 7, 31):
        np.testing.assert_allclose(
            M._harrell_sums(labels, scores, cut, counts, block_cells=block),
            M._harrell_sums(labels, scores, cut, counts),
            atol=1e-9,
        )


def test_noise_ceiling():
    gens = pd.DataFrame(
        {
            "prompt_id": ["p1"] * 2 + ["p2"] * 2 + ["p3"] * 2,
            "sample": [0, 1] * 3,
            "output_tokens": [10, 20, 30, 50, 100, 100],
            "finish_reason": ["stop", "stop", "stop", "length", "stop", "stop"],
        }
    )
    # two samples that order prompts identically: ceiling 1
    ceiling = M.noise_ceiling(M.sample_length_matrix(gens, ["p1", "p2", "p3"]), n_boot=50)
    assert ceiling["kendall_tau_b"] == pytest.approx(1.0) and ceiling["n_sample_pairs"] == 1
    # one sample per prompt: no ceiling
    assert M.noise_ceiling(np.array([[1.0], [2.0], [3.0]])) is None
    # four samples: the mean over the 6 sample pairs
    rng = np.random.default_rng(0)
    samples = rng.lognormal(5, 1, size=(80, 1)) * rng.lognormal(0, 0.3, size=(80, 4))
    ceiling = M.noise_ceiling(samples, n_boot=50)
    from itertools import combinations

    expected = np.mean([kendalltau(samples[:, a], samples[:, b]).statistic for a, b in combinations(range(4), 2)])
    assert ceiling["kendall_tau_b"] == pytest.approx(expected) and ceiling["n_sample_pairs"] == 6
    assert ceiling["ci_low"] <= ceiling["kendall_tau_b"] <= ceiling["ci_high"]
    # a sample whose lengths all tie (every answer cut at max_tokens) has no tau_b with any other:
    # the ceiling is that of the pairs that have one, as its interval already was
    tied = np.column_stack([samples[:, :2], np.full(80, 256.0)])
    ceiling = M.noise_ceiling(tied, n_boot=50)
    assert ceiling["kendall_tau_b"] == pytest.approx(kendalltau(samples[:, 0], samples[:, 1]).statistic)
    assert ceiling["n_sample_pairs"] == 1  # of 3: the two with the constant column have no tau_b
    assert ceiling["ci_low"] <= ceiling["kendall_tau_b"] <= ceiling["ci_high"]


# ---------------------------------------------------------------- synthetic project data


def _make_data(root, n_per_dataset=24, seed=0):
    """Prompts of 3 datasets; `m4` (k=4) and `m1` (k=1) answer the test prompts; m1 skips ds_c."""
    rng = np.random.default_rng(seed)
    rows = []
    for ds in DATASETS:
        for i in range(n_per_dataset):
            split = "test" if i % 3 else "train"
            words = int(rng.integers(3, 40))
            rows.append(
                {
                    "prompt_id": f"{ds}-{i:03d}",
                    "dataset": ds,
                    "split": split,
                    "source_id": str(i),
                    "prompt": " ".join(["explain"] * words) + f" item {i} of {ds}",
                }
            )
    prompts = pd.DataFrame(rows)
    write_table(prompts, prompts_path(root), PROMPTS)
    true_len = {pid: float(rng.lognormal(5, 1)) for pid in prompts["prompt_id"]}
    for model, k in (("m4", 4), ("m1", 1)):
        gens = []
        for pid in prompts["prompt_id"]:
            if model == "m1" and pid.startswith("ds_c"):
                continue
            for s in range(k):
                n = max(1, int(true_len[pid] * rng.lognormal(0, 0.2)))
                gens.append(
                    {
                        "prompt_id": pid,
                        "sample": s,
                        "output_tokens": min(n, 600),
                        "reasoning_tokens": 0,
                        "finish_reason": "length" if n >= 600 else "stop",
                        "prompt_tokens": 10,
                        "text": "x",
                        "reasoning": "",
                    }
                )
        write_table(pd.DataFrame(gens), generations_path(model, root), GENERATIONS)
    return prompts, true_len


def test_evaluate_core_on_hand_made_scores(tmp_path):
    from pipeline.evaluate import _no_nan, evaluate, transfer_matrix
    from pipeline.ranking.report_tables import render_markdown

    prompts, _ = _make_data(tmp_path)
    gens = {m: pd.read_parquet(generations_path(m, tmp_path)) for m in ("m4", "m1")}
    test = prompts[prompts["split"] == "test"]
    # the "oracle" predictor scores each prompt with m4's mean length; "reverse" with its negation
    mean_len = _labels(gens["m4"])["length"]
    oracle = mean_len.reindex(test["prompt_id"]).to_numpy()
    scores = pd.concat(
        [
            pd.DataFrame(
                {
                    "prompt_id": test["prompt_id"],
                    "dataset": test["dataset"],
                    "train_model": "m4",
                    "method": "oracle",
                    "score": oracle,
                }
            ),
            pd.DataFrame(
                {
                    "prompt_id": test["prompt_id"],
                    "dataset": test["dataset"],
                    "train_model": "m4",
                    "method": "reverse",
                    "score": -oracle,
                }
            ),
        ]
    )
    ptoks = pd.Series(np.random.default_rng(1).integers(5, 50, len(test)).astype(float), index=test["prompt_id"])
    r = evaluate(prompts, gens, scores, ptoks, delta=0.2, n_boot=100, seed=0, level=0.95, tfidf_ridge=TFIDF)

    o = r["predictors"]["m4"]["oracle"]["m4"]
    assert o["overall"]["kendall_tau_b"] == pytest.approx(1.0)
    assert o["overall"]["pair_accuracy"] == 1.0 and o["overall"]["n_pairs"] > 0
    assert o["overall"]["n_prompts"] == len(test) and set(o) == {"overall", *DATASETS}
    assert o["overall"]["beats_prompt_length"] is True
    rev = r["predictors"]["m4"]["reverse"]["m4"]["overall"]
    assert rev["kendall_tau_b"] == pytest.approx(-1.0) and rev["beats_prompt_length"] is False
    # transfer to m1 (other samples, ds_c missing): the value scipy gives on the same prompts
    t1 = r["predictors"]["m4"]["oracle"]["m1"]
    assert set(t1) == {"overall", "ds_a", "ds_b"}
    m1_len = _labels(gens["m1"])["length"]
    ids = sorted(set(test["prompt_id"]) & set(m1_len.index))
    expected = kendalltau(mean_len.reindex(ids), m1_len.reindex(ids)).statistic
    assert t1["overall"]["kendall_tau_b"] == pytest.approx(expected)
    assert t1["overall"]["ci_low"] <= t1["overall"]["kendall_tau_b"] <= t1["overall"]["ci_high"]
    # references: m4 has a noise ceiling below 1 (samples differ), m1 has none; the baseline is scipy's
    ref = r["references"]["m4"]["overall"]
    assert 0.3 < ref["noise_ceiling"]["kendall_tau_b"] < 1.0
    assert r["references"]["m1"]["overall"]["noise_ceiling"] is None
    lab = _labels(gens["m4"]).reindex(sorted(test["prompt_id"]))
    assert ref["prompt_length"]["kendall_tau_b"] == pytest.approx(
        kendalltau(ptoks.reindex(lab.index), lab["length"]).statistic
    )
    tm = transfer_matrix(r)["kendall_tau_b"]
    assert tm["oracle"]["m4"]["m4"] == pytest.approx(1.0) and tm["oracle"]["m4"]["m1"] == pytest.approx(expected)
    # TF-IDF + ridge: m4 has 24 labelled train prompts (no val split: the grid's first alpha), m1 only 16
    tf = ref["tfidf_ridge"]
    assert {
        "kendall_tau_b",
        "ci_low",
        "ci_high",
        "n_prompts",
        "pair_accuracy",
        "n_pairs",
        "n_train_prompts",
        "alpha",
    } <= set(tf)
    assert tf["n_train_prompts"] == 24 and tf["n_val_prompts"] == 0 and tf["alpha"] == ALPHAS[0]
    assert tf["n_prompts"] == len(test)
    assert r["references"]["m1"]["overall"]["tfidf_ridge"] is None
    assert o["overall"]["beats_tfidf_ridge"] is True and rev["beats_tfidf_ridge"] is False
    assert o["overall"]["gain_over_tfidf_ridge"] == pytest.approx(1.0 - tf["kendall_tau_b"])
    assert t1["overall"]["gain_over_tfidf_ridge"] is None and t1["overall"]["beats_tfidf_ridge"] is False
    assert r["method_differences"] == {}  # no pairwise predictor here
    assert r["settings"]["excluded_test_prompts"]["n_prompts"] == 0
    # m4 has answers cut at 600 tokens: Harrell's C in every cell and reference, on tau_b's resamples
    harrell_keys = {"harrell_c", "harrell_c_ci_low", "harrell_c_ci_high", "n_comparable_pairs"}
    c_of, n_comparable = M.harrell_c(lab["length"], lab["length"], lab["truncated"])
    assert lab["truncated"].any() and n_comparable < len(lab) * (len(lab) - 1) / 2
    assert o["overall"]["harrell_c"] == 1.0 == c_of and o["overall"]["n_comparable_pairs"] == n_comparable
    assert rev["harrell_c"] == 0.0 and rev["harrell_c_ci_low"] == rev["harrell_c_ci_high"] == 0.0
    assert all(harrell_keys <= set(stat) for stat in o.values())
    base = ref["prompt_length"]
    assert base["harrell_c"] == pytest.approx(M.harrell_c(lab["length"], ptoks.reindex(lab.index), lab["truncated"])[0])
    idx = M.bootstrap_indices(len(lab), 100, 0)  # the resamples of tau_b's interval
    by_hand = M.percentile_ci(M.bootstrap_harrell_c(lab["length"], ptoks.reindex(lab.index), lab["truncated"], idx))
    assert (base["harrell_c_ci_low"], base["harrell_c_ci_high"]) == pytest.approx(by_hand)
    assert harrell_keys <= set(tf)
    md = render_markdown(json.loads(json.dumps(_no_nan(r))))  # the report: C in a table of its own, and why
    c_table = md[md.index("### Harrell's C where answers were cut (¶)") : md.index("## Cross-model transfer")]
    rows = {line.split(" | ")[0]: line for line in c_table.splitlines() if line.startswith("| ")}
    assert "| 1.000 [1.000, 1.000] |" in rows["| oracle"] and "| 0.000 [0.000, 0.000] |" in rows["| reverse"]
    assert "| *prompt length (tokens)*" in rows and "| *noise ceiling (sample vs sample)*" not in rows
    assert "C counts only pairs whose order is known" in c_table

    # a test prompt whose text is a train prompt of another dataset (case and spacing aside) is left
    # out of every figure; its score may be there, and nothing else moves
    twin_id = test["prompt_id"].iloc[0]
    train_text = prompts.loc[prompts["split"] == "train", "prompt"].iloc[0]
    twinned = prompts.copy()
    twinned.loc[twinned["prompt_id"] == twin_id, "prompt"] = "  " + train_text.upper().replace(" ", "\n ")
    r2 = evaluate(twinned, gens, scores, ptoks, delta=0.2, n_boot=100, seed=0, level=0.95, tfidf_ridge=TFIDF)
    excluded = r2["settings"]["excluded_test_prompts"]
    twin_dataset = test.set_index("prompt_id").loc[twin_id, "dataset"]
    assert excluded["n_prompts"] == 1 and excluded["by_dataset"] == {twin_dataset: 1}
    assert r2["predictors"]["m4"]["oracle"]["m4"]["overall"]["n_prompts"] == len(test) - 1
    assert r2["references"]["m4"]["overall"]["n_prompts"] == len(test) - 1


# ---------------------------------------------------------------- TF-IDF + ridge reference


def _keyword_corpus(n, seed):
    """Prompts whose answer length is set by a keyword: "essay" long, "list" medium, else short."""
    rng = np.random.default_rng(seed)
    fillers = ["please", "the", "topic", "about", "a", "of", "river", "city", "history", "music", "space"]
    kinds = rng.choice(["essay", "list", "define"], size=n)
    texts = [f"{kind} " + " ".join(rng.choice(fillers, size=int(rng.integers(3, 9)))) for kind in kinds]
    base = {"essay": 600.0, "list": 120.0, "define": 25.0}
    lengths = np.array([base[k] * rng.lognormal(0, 0.3) for k in kinds])
    return texts, lengths


def test_tfidf_ridge_ranks_by_keyword_and_chooses_alpha_on_val():
    import inspect

    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import Ridge

    from pipeline.evaluate import tfidf_ridge_scores

    train_x, train_y = _keyword_corpus(80, 0)
    val_x, val_y = _keyword_corpus(30, 1)
    test_x, test_y = _keyword_corpus(60, 2)
    scores, alpha, val_tau = tfidf_ridge_scores(
        train_x, train_y, val_x, val_y, test_x, alphas=ALPHAS, ngram_max=2, min_df=2
    )
    assert len(scores) == len(test_x)
    assert M.kendall_tau_b(scores, test_y) > 0.5
    assert alpha in ALPHAS and val_tau > 0.5
    # alpha is the grid's best on val (the first on ties), from fits on train alone
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, lowercase=True).fit(train_x)
    val_taus = [
        M.kendall_tau_b(
            Ridge(alpha=a).fit(vec.transform(train_x), np.log1p(train_y)).predict(vec.transform(val_x)), val_y
        )
        for a in ALPHAS
    ]
    assert alpha == ALPHAS[int(np.argmax(val_taus))] and val_tau == pytest.approx(max(val_taus))
    # test labels cannot come in (no parameter for them), and test texts do not move the fit
    assert [p for p in inspect.signature(tfidf_ridge_scores).parameters if p.startswith("test")] == ["test_texts"]
    again, alpha_again, _ = tfidf_ridge_scores(
        train_x, train_y, val_x, val_y, test_x[:7] + ["essay"], alphas=ALPHAS, ngram_max=2, min_df=2
    )
    assert alpha_again == alpha
    np.testing.assert_allclose(again[:7], scores[:7])
    # no val prompts: the grid's first alpha, val tau_b NaN
    _, alpha_none, tau_none = tfidf_ridge_scores(
        train_x, train_y, [], [], test_x, alphas=[3.0, 1.0], ngram_max=2, min_df=2
    )
    assert alpha_none == 3.0 and np.isnan(tau_none)


def _keyword_project(n_per_dataset=60):
    """Prompts of 2 datasets, split train/val/test, lengths set by a keyword; `kw` answers all (k=2).
    Scores: pairwise = the true lengths (perfect), pointwise = noise."""
    rows, gens = [], []
    rng = np.random.default_rng(5)
    for d, ds in enumerate(("ds_a", "ds_b")):
        texts, lengths = _keyword_corpus(n_per_dataset, 10 + d)
        for i, (text, length) in enumerate(zip(texts, lengths)):
            pid = f"{ds}-{i:03d}"
            rows.append(
                {
                    "prompt_id": pid,
                    "dataset": ds,
                    "split": ("train", "train", "val", "test", "test")[i % 5],
                    "source_id": str(i),
                    "prompt": text,
                }
            )
            for s in range(2):
                gens.append(
                    {
                        "prompt_id": pid,
                        "sample": s,
                        "output_tokens": int(length * rng.lognormal(0, 0.1)) + 1,
                        "reasoning_tokens": 0,
                        "finish_reason": "stop",
                        "prompt_tokens": 10,
                        "text": "x",
                        "reasoning": "",
                    }
                )
    prompts, gens = pd.DataFrame(rows), {"kw": pd.DataFrame(gens)}
    test = prompts[prompts["split"] == "test"]
    truth = _labels(gens["kw"])["length"].reindex(test["prompt_id"]).to_numpy()
    noise = np.random.default_rng(6).normal(size=len(test))
    scores = pd.concat(
        [
            pd.DataFrame(
                {
                    "prompt_id": test["prompt_id"],
                    "dataset": test["dataset"],
                    "train_model": "kw",
                    "method": method,
                    "score": score,
                }
            )
            for method, score in (("pairwise", truth), ("pointwise", noise))
        ]
    )
    ptoks = pd.Series(test["prompt"].str.len().astype(float).to_numpy(), index=test["prompt_id"])
    return prompts, gens, scores, ptoks


def test_evaluate_tfidf_reference_fits_train_chooses_on_val_and_is_paired(monkeypatch):
    import pipeline.evaluate as E

    prompts, gens, scores, ptoks = _keyword_project()
    calls = []
    real = E.tfidf_ridge_scores

    def spy(train_texts, train_lengths, val_texts, val_lengths, test_texts, **kw):
        calls.append((list(train_texts), list(val_texts), list(test_texts)))
        return real(train_texts, train_lengths, val_texts, val_lengths, test_texts, **kw)

    monkeypatch.setattr(E, "tfidf_ridge_scores", spy)
    r = E.evaluate(prompts, gens, scores, ptoks, delta=0.2, n_boot=200, seed=0, level=0.95, tfidf_ridge=TFIDF)
    split_of = prompts.set_index("prompt")["split"]
    ((train_texts, val_texts, test_texts),) = calls
    assert set(split_of[train_texts]) == {"train"} and set(split_of[val_texts]) == {"val"}
    assert set(split_of[test_texts]) == {"test"}

    tf = r["references"]["kw"]["overall"]["tfidf_ridge"]
    assert tf["n_train_prompts"] == 48 and tf["n_val_prompts"] == 24 and tf["alpha"] in ALPHAS
    assert tf["kendall_tau_b"] > 0.5 and tf["n_prompts"] == 48
    assert set(r["references"]["kw"]) == {"overall", "ds_a", "ds_b"}
    assert all(r["references"]["kw"][g]["tfidf_ridge"]["alpha"] == tf["alpha"] for g in ("ds_a", "ds_b"))
    pw = r["predictors"]["kw"]["pairwise"]["kw"]["overall"]
    pt = r["predictors"]["kw"]["pointwise"]["kw"]["overall"]
    assert pw["beats_tfidf_ridge"] is True and pt["beats_tfidf_ridge"] is False
    assert pw["tfidf_gain_ci_low"] <= pw["gain_over_tfidf_ridge"] <= pw["tfidf_gain_ci_high"]
    assert pw["gain_over_tfidf_ridge"] == pytest.approx(pw["kendall_tau_b"] - tf["kendall_tau_b"])
    # the keys other tools read are all still there
    assert {"gain_over_prompt_length", "gain_ci_low", "gain_ci_high", "beats_prompt_length"} <= set(pt)
    # pairwise minus pointwise, paired: the same resamples give the same interval as by hand
    d = r["method_differences"]["kw"]["kw"]["overall"]["pointwise"]
    assert set(d) == {"diff", "ci_low", "ci_high"}
    assert d["diff"] == pytest.approx(pw["kendall_tau_b"] - pt["kendall_tau_b"]) and d["ci_low"] > 0
    lab = _labels(gens["kw"]).reindex(sorted(prompts.loc[prompts["split"] == "test", "prompt_id"]))
    idx = M.bootstrap_indices(len(lab), 200, 0)
    s = scores.set_index(["method", "prompt_id"])["score"]
    by_hand = M.percentile_ci(
        M.bootstrap_taus(s["pairwise"].reindex(lab.index), lab["length"], idx)
        - M.bootstrap_taus(s["pointwise"].reindex(lab.index), lab["length"], idx)
    )
    assert (d["ci_low"], d["ci_high"]) == pytest.approx(by_hand)
    assert set(r["method_differences"]["kw"]["kw"]) == {"overall", "ds_a", "ds_b"}
    assert r["settings"]["tfidf_ridge"]["alphas"] == ALPHAS


def test_report_shows_tfidf_row_marks_and_method_differences():
    from pipeline.evaluate import _no_nan, evaluate
    from pipeline.ranking.report_tables import render_markdown

    prompts, gens, scores, ptoks = _keyword_project()
    r = _no_nan(evaluate(prompts, gens, scores, ptoks, delta=0.2, n_boot=100, seed=0, level=0.95, tfidf_ridge=TFIDF))
    md = render_markdown(json.loads(json.dumps(r)))  # as read back from ranking.json
    rows = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| ")}
    assert "| *TF-IDF + ridge (train split)*" in rows and "| *prompt length (tokens)*" in rows
    assert "‡" not in rows["| pairwise (PARS)"] and "‡" in rows["| pointwise"]
    assert "‡: does not beat the TF-IDF + ridge reference" in md
    assert "| *TF-IDF + ridge*" in rows  # in the transfer table too
    assert "Pairwise minus each other method" in md and "| kw → kw |" in md and "− pointwise" in md
    assert "lexical prior" not in md  # said only of the predictors that carry one
    r["settings"]["lexical_prior"] = ["kw/pairwise"]
    assert "1 of the predictors (`kw/pairwise`) score with a lexical prior" in render_markdown(r)
    r["settings"]["lexical_prior"] = [f"{m}/{meth}" for m, by in r["predictors"].items() for meth in by]
    assert "Every predictor scores with a lexical prior" in render_markdown(r)
    assert "of which cut" not in md  # every answer stopped
    assert "harrell_c" not in json.dumps(r) and "C: Harrell's C" not in md  # so no Harrell's C either
    for group in r["references"]["kw"].values():
        group["n_truncated"] = 2
    cut = render_markdown(r)
    assert "| *of which cut ¶* | 2 |" in cut and "¶: prompts with at least one answer cut" in cut
    assert "Left out of every τ_b" not in md
    r["settings"]["excluded_test_prompts"] = {"n_prompts": 3, "by_dataset": {"a": 1, "b": 2}}
    assert "Left out of every τ_b above: 3 test prompts (a 1, b 2)" in render_markdown(r)
    # an eval model without the reference: n/a, and no ‡ for it
    few = evaluate(
        prompts,
        gens,
        scores,
        ptoks,
        delta=0.2,
        n_boot=50,
        seed=0,
        level=0.95,
        tfidf_ridge={**TFIDF, "min_train_prompts": 1000},
    )
    md_few = render_markdown(few)
    assert "n/a (few train prompts)" in md_few and "‡" not in md_few
    # a ranking.json from before this reference (no tfidf keys, no method_differences) still renders
    for group in few["references"]["kw"].values():
        del group["tfidf_ridge"]
    del few["method_differences"]
    old = render_markdown(few)
    assert "TF-IDF" not in old and "Pairwise minus" not in old and "| pairwise (PARS) |" in old


def test_evaluate_refuses_an_infinite_score():
    """inf - inf voids every bootstrap resample: a null interval and no gain, silently; refused instead."""
    from pipeline.evaluate import evaluate

    prompts, gens, scores, ptoks = _keyword_project()
    scores = scores.reset_index(drop=True)
    scores.loc[(scores["method"] == "pairwise").to_numpy().nonzero()[0][:2], "score"] = np.inf
    with pytest.raises(ValueError, match="kw/pairwise gives an infinite score to some kw prompts"):
        evaluate(prompts, gens, scores, ptoks, delta=0.2, n_boot=20, seed=0, level=0.95, tfidf_ridge=TFIDF)


def test_report_shows_an_estimated_noise_ceiling_only_where_evaluate_has_none():
    from pipeline.evaluate import _no_nan, evaluate
    from pipeline.ranking.report_tables import render_markdown

    prompts, gens, scores, ptoks = _keyword_project()
    r = json.loads(
        json.dumps(
            _no_nan(evaluate(prompts, gens, scores, ptoks, delta=0.2, n_boot=50, seed=0, level=0.95, tfidf_ridge=TFIDF))
        )
    )
    group = next(iter(r["references"]["kw"]))
    estimate = {
        "model": "kw",
        "dataset": group,
        "what": "two replies of repeated prompts",
        "command": "python benchmarks/x.py",
        "noise_ceiling": {"kendall_tau_b": 0.616, "ci_low": 0.541, "ci_high": 0.693, "n_prompts": 171},
    }
    has_own = r["references"]["kw"][group].get("noise_ceiling") is not None
    md = render_markdown(r, [estimate])
    assert ("0.616 [0.541, 0.693] §" in md) is not has_own
    r["references"]["kw"][group]["noise_ceiling"] = None  # k=1: the estimate fills the cell, with its note
    md = render_markdown(r, [estimate])
    assert "0.616 [0.541, 0.693] §" in md and "§: kw's noise ceiling estimated outside the test split" in md
    assert "171 prompts (`python benchmarks/x.py`)" in md
    assert "§" not in render_markdown(r, [{**estimate, "model": "other"}])  # another model's: not shown


# ---------------------------------------------------------------- the stage end to end


@pytest.fixture
def project(tmp_path, tiny_bert_config, tokenizer, monkeypatch):
    """Synthetic data + tiny random predictors models/{m4,m1}/{pairwise,pointwise}; cwd = tmp_path."""
    import torch

    from pipeline.ranking.checkpoint import save_checkpoint
    from pipeline.ranking.model import LengthRanker

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    _make_data(tmp_path / "data")
    for i, (model, method) in enumerate(
        [("m4", "pairwise"), ("m4", "pointwise"), ("m1", "pairwise"), ("m1", "pointwise")]
    ):
        torch.manual_seed(i)
        save_checkpoint(
            LengthRanker.from_config(tiny_bert_config),
            tokenizer,
            tmp_path / "models" / model / method,
            method=method,
            max_length=32,
            encoder="tiny-random-bert",
            trained_on={"model": model},
        )
    params = params_section(
        "evaluate",
        train_models=["m4", "m1"],
        methods=["pairwise", "pointwise"],
        eval_models=["m4", "m1"],
        cross_models=[],
        blends=[],
        delta=0.2,
        bootstrap={"n": 60, "seed": 42, "level": 0.95},
        batch_size=8,
        baseline_tokenizer="minilm-l6",
        tfidf_ridge=TFIDF,
        wandb={"enabled": True, "project": "pars-test", "mode": "offline"},
    )
    return tmp_path, params


def test_evaluate_stage_writes_metrics_scores_plots_and_wandb(project, capsys):
    import yaml

    from pipeline.cli import main as pars
    from pipeline.contracts import SCORES, scores_path
    from pipeline.report import main as report_main
    from pipeline.serving.scorer import Scorer

    root, params = project
    (root / "params.yaml").write_text(yaml.safe_dump({"evaluate": params}))
    assert pars(["evaluate", "--params", "params.yaml"]) == 0
    assert "| pairwise (PARS) |" in capsys.readouterr().out  # the table is printed

    ranking = json.loads((root / "metrics/ranking.json").read_text())
    for model in ("m4", "m1"):
        for method in ("pairwise", "pointwise"):
            for eval_model in ("m4", "m1"):
                cell = ranking["predictors"][model][method][eval_model]["overall"]
                assert {"kendall_tau_b", "ci_low", "ci_high", "n_prompts"} <= set(cell)
                assert cell["ci_low"] <= cell["kendall_tau_b"] <= cell["ci_high"]
    assert ranking["references"]["m4"]["overall"]["noise_ceiling"]["kendall_tau_b"] > 0
    assert ranking["references"]["m1"]["overall"]["prompt_length"]["n_prompts"] == 32
    # TF-IDF + ridge: m4 has 24 labelled train prompts, m1 16 (< 20): null, and no gain over it
    assert ranking["references"]["m4"]["overall"]["tfidf_ridge"]["n_train_prompts"] == 24
    assert ranking["references"]["m1"]["overall"]["tfidf_ridge"] is None
    for model in ("m4", "m1"):
        for method in ("pairwise", "pointwise"):
            assert isinstance(ranking["predictors"][model][method]["m4"]["overall"]["beats_tfidf_ridge"], bool)
            assert ranking["predictors"][model][method]["m1"]["overall"]["beats_tfidf_ridge"] is False
    assert set(ranking["method_differences"]["m1"]["m4"]["overall"]["pointwise"]) == {"diff", "ci_low", "ci_high"}
    transfer = json.loads((root / "metrics/transfer.json").read_text())
    assert (
        transfer["kendall_tau_b"]["pairwise"]["m1"]["m4"]
        == ranking["predictors"]["m1"]["pairwise"]["m4"]["overall"]["kendall_tau_b"]
    )

    scores = pd.read_parquet(scores_path(root / "data"))
    assert list(scores.columns) == SCORES.names
    assert len(scores) == 48 * 4 and scores.groupby(["train_model", "method"]).size().eq(48).all()
    # scored once per predictor, and exactly what the serving Scorer gives at evaluate's precision
    assert ranking["settings"]["precision"] in ("32-true", "bf16-mixed")
    prompts = pd.read_parquet(prompts_path(root / "data")).set_index("prompt_id")
    sub = scores[(scores.train_model == "m1") & (scores.method == "pointwise")].head(5)
    scorer = Scorer.from_pretrained(root / "models/m1/pointwise", precision=params["precision"])
    assert scorer.precision == ranking["settings"]["precision"]
    direct = scorer.score(prompts.loc[sub.prompt_id, "prompt"].tolist())
    np.testing.assert_allclose(sub["score"].to_numpy(), direct, rtol=1e-4, atol=1e-5)

    for name in ("tau_b.png", "transfer.png"):
        assert (root / "plots/evaluate" / name).stat().st_size > 5000
    csv = pd.read_csv(root / "plots/evaluate/tau_b.csv")
    assert len(csv) == 8 and csv["kendall_tau_b"].between(-1, 1).all()
    assert list((root / "wandb").glob("offline-run-*")), "no offline W&B run written"

    assert report_main(["--ranking", "metrics/ranking.json", "--out", "metrics/report.md"]) == 0
    md = (root / "metrics/report.md").read_text()
    assert "pairwise (PARS)" in md and "noise ceiling" in md and "ds_a · m4" in md and "Cross-model transfer" in md
    assert "TF-IDF + ridge (train split)" in md and "Pairwise minus each other method" in md


def test_evaluate_refuses_missing_tfidf_params(project):
    from pipeline.evaluate import run

    _, params = project
    with pytest.raises(KeyError, match="evaluate.tfidf_ridge lacks alphas"):
        run({**params, "tfidf_ridge": {k: v for k, v in TFIDF.items() if k != "alphas"}})


def test_evaluate_refuses_missing_predictor(project):
    from pipeline.evaluate import run

    _, params = project
    with pytest.raises(FileNotFoundError, match="models/m4/listwise, models/m1/listwise"):
        run({**params, "methods": ["pairwise", "listwise"]})


def test_dvc_stage_declares_what_params_make_evaluate_read():
    """evaluate's deps in dvc.yaml are listed by hand: they must cover params `evaluate`'s lists."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    params = yaml.safe_load((root / "params.yaml").read_text())["evaluate"]
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    deps = set(stages["evaluate"]["deps"])
    expected = {f"models/{m}/{meth}" for m in params["train_models"] for meth in params["methods"]}
    expected |= {f"data/generations/{m}" for m in params["eval_models"]} | {"data/prompts"}
    assert expected <= deps, f"dvc.yaml evaluate misses deps {sorted(expected - deps)}"
    assert "metrics/ranking.json" in stages["export"]["deps"]
