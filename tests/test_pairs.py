"""pairs stage: labels, the δ filter with truncated answers, sampling, files and errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import make_tables, params_section, write_dataset, write_params

from pipeline.contracts import (
    GENERATIONS,
    LABELS,
    PAIRS,
    generations_path,
    read_table,
    write_table,
)
from pipeline.pairs import build_pairs, count_passing_pairs, main
from pipeline.ranking.labels import in_batch_pairs, keep_mask, prompt_labels


def test_labels_are_mean_tokens_and_mark_truncation():
    gens = pd.DataFrame(
        {
            "prompt_id": ["p", "p", "q", "q"],
            "sample": [0, 1, 0, 1],
            "output_tokens": [10, 20, 512, 100],
            "finish_reason": ["stop", "stop", "length", "stop"],
        }
    )
    lab = prompt_labels(gens).set_index("prompt_id")
    assert lab.loc["p", "length"] == 15.0 and not lab.loc["p", "truncated"]
    assert lab.loc["q", "length"] == 306.0 and lab.loc["q", "truncated"]
    assert lab.loc["q", "n_samples"] == 2


def test_delta_filter_boundary_and_truncation_rule():
    # |100-80|/100 = 0.2 passes at delta 0.2; |100-81|/100 = 0.19 does not.
    assert keep_mask([100, 100], [80, 81], [False, False], [False, False], 0.2).tolist() == [True, False]
    # truncated longer member: kept (its true length only grows); truncated shorter member: dropped.
    assert keep_mask([300, 300], [100, 100], [True, False], [False, True], 0.2).tolist() == [True, False]
    # zero-length pair carries no order
    assert keep_mask([0], [0], [False], [False], 0.2).tolist() == [False]


def test_in_batch_pairs_lists_every_kept_pair_once():
    pairs = in_batch_pairs(np.array([10.0, 11.0, 50.0, 100.0]), np.array([False, False, False, True]), 0.2)
    # (0,1) too close; (2,3) kept (3 truncated is the longer); all others kept
    assert sorted(map(tuple, pairs.tolist())) == [(0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


def test_build_pairs_within_splits_seeded_and_filtered():
    prompts, gens = make_tables(truncated={"train000"})
    params = {"delta": 0.2, "partners": 4, "max_tries_factor": 10, "seed": 42}
    pairs, labels, metrics = build_pairs(gens, prompts, params, model="toy")
    split = dict(zip(labels["prompt_id"], labels["split"]))
    trunc = dict(zip(labels["prompt_id"], labels["truncated"]))
    for name, df in pairs.items():
        assert {split[p] for p in df["a"]} | {split[p] for p in df["b"]} == {name}  # never crosses splits
        rel = (df["len_a"] - df["len_b"]).abs() / np.maximum(df["len_a"], df["len_b"])
        assert (rel >= 0.2).all()
        assert ((df["label"] == 1) == (df["len_a"] > df["len_b"])).all()
        shorter = np.where(df["len_a"] < df["len_b"], df["a"], df["b"])
        assert not any(trunc[p] for p in shorter)  # a truncated answer is never the shorter one
        assert df.groupby("a").size().max() <= 4
        keys = {tuple(sorted(ab)) for ab in zip(df["a"], df["b"])}
        assert len(keys) == len(df)  # an unordered pair is kept once
    assert "test" not in pairs
    assert metrics["train"]["n_truncated_prompts"] == 1
    assert 0 < metrics["train"]["label_balance"] < 1
    assert metrics["train"]["dropped_for_truncation"] > 0
    again, _, _ = build_pairs(gens, prompts, params, model="toy")
    pd.testing.assert_frame_equal(pairs["train"], again["train"])
    other, _, _ = build_pairs(gens, prompts, params | {"seed": 7}, model="toy")
    assert not pairs["train"].equals(other["train"])


def test_stage_writes_contract_files(tmp_path):
    write_dataset(tmp_path / "data")
    params = write_params(tmp_path / "params.yaml")
    assert (
        main(
            [
                "--model",
                "toy",
                "--params",
                str(params),
                "--data",
                str(tmp_path / "data"),
                "--metrics",
                str(tmp_path / "metrics"),
            ]
        )
        == 0
    )
    out = tmp_path / "data" / "pairs" / "toy"
    train, val = read_table(out / "train.parquet", PAIRS), read_table(out / "val.parquet", PAIRS)
    labels = read_table(out / "labels.parquet", LABELS)
    assert len(train) > 0 and len(val) > 0
    assert set(labels["split"]) == {"train", "val", "test"}
    metrics = json.loads((tmp_path / "metrics" / "toy.json").read_text())
    assert metrics["train"]["n_pairs"] == len(train) and metrics["val"]["n_pairs"] == len(val)
    assert json.loads((out / "meta.json").read_text())["delta"] == 0.2


def test_errors_name_the_problem(tmp_path):
    data = tmp_path / "data"
    params = write_params(tmp_path / "params.yaml")
    prompts, gens = write_dataset(data)
    args = ["--params", str(params), "--data", str(data), "--metrics", str(tmp_path / "m")]
    with pytest.raises(FileNotFoundError, match=r"no generations.*generations exist for: toy;"):
        main(["--model", "absent", *args])
    write_table(gens.iloc[:0], generations_path("empty", data), GENERATIONS)
    with pytest.raises(ValueError, match="no rows"):
        main(["--model", "empty", *args])
    generations_path("broken", data).parent.mkdir(parents=True)
    generations_path("broken", data).write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="not a readable parquet"):
        main(["--model", "broken", *args])
    few = gens[gens["prompt_id"].isin(["train000", "train001", "val000"])]
    write_table(few, generations_path("few", data), GENERATIONS)
    with pytest.raises(ValueError, match="val split has 1 prompt"):
        main(["--model", "few", *args])
    same = gens.assign(output_tokens=100)
    write_table(same, generations_path("same", data), GENERATIONS)
    with pytest.raises(ValueError, match="no train pair passes"):
        main(["--model", "same", *args])
    odd = gens.assign(finish_reason="abort")
    with pytest.raises(ValueError, match="finish_reason"):
        build_pairs(odd, prompts, params_section("pairs", delta=0.2), model="odd")
    stale = gens.assign(prompt_id=gens["prompt_id"].where(gens["prompt_id"] != "train000", "gone"))
    with pytest.raises(ValueError, match=r"generations of stale: 1 prompt_id\(s\) are not in the prompts table"):
        build_pairs(stale, prompts, params_section("pairs", delta=0.2), model="stale")


@pytest.mark.parametrize("delta", [0.2, 0.25, 0.5])
def test_pass_counts_match_the_filter_over_every_pair(delta):
    # lengths with many ties, zeros, boundary ratios (8 vs 10 at delta 0.2) and means of k samples
    rng = np.random.default_rng(1)
    for trial in range(60):
        n = int(rng.integers(0, 60))
        k = 1 + trial % 4
        lengths = rng.integers(0, 30, size=(n, k)).mean(axis=1)
        truncated = rng.random(n) < 0.3
        i, j = np.triu_indices(n, k=1)
        untruncated = np.zeros(len(i), bool)
        expected = (
            int(keep_mask(lengths[i], lengths[j], untruncated, untruncated, delta).sum()),
            int(keep_mask(lengths[i], lengths[j], truncated[i], truncated[j], delta).sum()),
        )
        assert count_passing_pairs(lengths, truncated, delta) == expected
