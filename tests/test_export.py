"""export: the chosen predictor -> models/export/<name>/ (self-describing, hash-checked, Scorer-loadable)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.export import export_metrics
from pipeline.hashing import sha256_file
from pipeline.ranking.checkpoint import META, WEIGHTS, CheckpointError

RANKING = {
    "predictors": {
        "m": {
            "pairwise": {
                "m": {
                    "overall": {
                        "kendall_tau_b": 0.41,
                        "ci_low": 0.33,
                        "ci_high": 0.49,
                        "n_prompts": 120,
                        "pair_accuracy": 0.7,
                    },
                    "ds_a": {"kendall_tau_b": 0.38},
                    "ds_b": {"kendall_tau_b": 0.45},
                }
            }
        }
    },
    "references": {
        "m": {"overall": {"prompt_length": {"kendall_tau_b": 0.12}, "noise_ceiling": {"kendall_tau_b": 0.6}}}
    },
}


@pytest.fixture
def trained(tmp_path, tiny_ranker, tokenizer):
    """A train-stage output models/m/pairwise/ and evaluate's metrics/ranking.json."""
    from pipeline.ranking.checkpoint import save_checkpoint

    save_checkpoint(
        tiny_ranker,
        tokenizer,
        tmp_path / "models/m/pairwise",
        method="pairwise",
        max_length=64,
        encoder="tiny-random-bert",
        trained_on={"pairs": "data/pairs/m", "n_train_pairs": 1000},
    )
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics/ranking.json").write_text(json.dumps(RANKING))
    return tmp_path


def _export(root, prompts_file=None, **params):
    from pipeline.export import run

    return run(
        {"name": "pars-m", "model": "m", "method": "pairwise", **params},
        models_root=root / "models",
        ranking_path=root / "metrics/ranking.json",
        out_root=root / "models/export",
        prompts_file=prompts_file,
    )


def test_export_is_self_describing_and_scores_like_the_trained_model(trained):
    from pipeline.serving.scorer import Scorer

    stale = trained / "models/export/pars-m/stale.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier export")
    dst = _export(trained)
    assert dst == trained / "models/export/pars-m"
    assert not stale.exists()  # the out dir is rewritten whole
    names = {p.name for p in dst.iterdir()}
    assert {"model.safetensors", "config.json", "pars.json"} <= names and names & {"tokenizer.json", "vocab.txt"}
    meta = json.loads((dst / META).read_text())
    assert meta["format_version"] == 1 and meta["method"] == "pairwise" and meta["max_length"] == 64
    assert meta["score_direction"] == "higher_is_longer" and meta["encoder"] == "tiny-random-bert"
    assert meta["test_tau_b"] == 0.41 and meta["test_metrics"]["ci_low"] == 0.33
    assert meta["test_metrics"]["per_dataset_tau_b"] == {"ds_a": 0.38, "ds_b": 0.45}
    assert meta["test_metrics"]["prompt_length_tau_b"] == 0.12
    assert meta["trained_on"] == {"model": "m", "pairs": "data/pairs/m", "n_train_pairs": 1000}
    assert meta["weights_sha256"] == sha256_file(dst / WEIGHTS) == sha256_file(trained / "models/m/pairwise" / WEIGHTS)
    texts = ["short one", "a much longer prompt " * 10]
    np.testing.assert_allclose(
        Scorer.from_pretrained(dst).score(texts),
        Scorer.from_pretrained(trained / "models/m/pairwise").score(texts),
        atol=1e-6,
    )


def test_export_refuses_corrupt_source_and_missing_metrics(trained):
    with pytest.raises(CheckpointError, match="listwise does not exist"):
        _export(trained, method="listwise")
    ranking = json.loads((trained / "metrics/ranking.json").read_text())
    with pytest.raises(ValueError, match="no test tau_b for m/pairwise"):
        export_metrics({"predictors": {}, "references": ranking["references"]}, "m", "pairwise", ["m"], "ranking.json")
    weights = trained / "models/m/pairwise" / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(CheckpointError, match="does not match"):
        _export(trained)
    assert not (trained / "models/export/pars-m").exists()  # nothing half-exported
    (trained / "metrics/ranking.json").unlink()
    with pytest.raises(FileNotFoundError, match="run evaluate first"):
        _export(trained)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda meta: [], "pars.json holds a JSON list, not an object"),
        (lambda meta: {**meta, "trained_on": ["m"]}, r"pars.json trained_on \['m'\]: expected a mapping"),
        (lambda meta: {**meta, "trained_on": {"members": "m"}}, "pars.json trained_on.members 'm': expected a list"),
        (lambda meta: {**meta, "trained_on": {"model": 5}}, "pars.json trained_on.model 5: expected a model name"),
    ],
)
def test_export_refuses_a_source_pars_json_of_the_wrong_shape(trained, change, match):
    meta_file = trained / "models/m/pairwise" / META
    meta_file.write_text(json.dumps(change(json.loads(meta_file.read_text()))))
    with pytest.raises(CheckpointError, match=match):
        _export(trained)
    assert not (trained / "models/export").exists()


def test_an_export_that_fails_its_acceptance_test_leaves_the_previous_one(trained, tiny_ranker, tokenizer):
    import torch

    from pipeline.ranking.checkpoint import save_checkpoint

    good = _export(trained)
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    with torch.no_grad():
        tiny_ranker.head.bias.fill_(float("nan"))  # a checkpoint whose scores are all NaN
    save_checkpoint(
        tiny_ranker,
        tokenizer,
        trained / "models/m/pairwise",
        method="pairwise",
        max_length=64,
        encoder="tiny-random-bert",
    )
    with pytest.raises(ValueError, match="non-finite scores.*left as it was"):
        _export(trained)
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    assert sorted(p.name for p in good.parent.iterdir()) == ["pars-m"]  # no temp copy left behind


def test_cross_model_export_metrics_take_the_lowest_member():
    stat = {"kendall_tau_b": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n_prompts": 10, "pair_accuracy": 0.7}
    ranking = {
        "predictors": {
            "both": {"pairwise": {"a": {"overall": stat}, "b": {"overall": {**stat, "kendall_tau_b": 0.3}}}}
        },
        "references": {"a": {"overall": {}}, "b": {"overall": {}}},
    }
    metrics, tau = export_metrics(ranking, "both", "pairwise", ["a", "b"], "ranking.json")
    assert tau == 0.3 and set(metrics["by_eval_model"]) == {"a", "b"}
    assert metrics["by_eval_model"]["a"]["kendall_tau_b"] == 0.5


def test_export_hashes_every_file_and_the_loader_checks_them(trained):
    from pipeline.serving.scorer import FILES_SHA256, Scorer

    dst = _export(trained)
    listed = json.loads((dst / META).read_text())[FILES_SHA256]
    assert set(listed) == {p.name for p in dst.iterdir() if p.name != META}
    assert {"config.json", WEIGHTS} <= set(listed) and set(listed) & {"tokenizer.json", "vocab.txt"}
    tok = "tokenizer.json" if "tokenizer.json" in listed else "vocab.txt"
    for name in ("config.json", tok):  # a changed config or tokenizer would load silently and score differently
        original = (dst / name).read_bytes()
        (dst / name).write_bytes(original + b" ")
        with pytest.raises(CheckpointError, match=f"{name} sha256 .* changed after the checkpoint was written"):
            Scorer.from_pretrained(dst)
        (dst / name).unlink()
        with pytest.raises(CheckpointError, match=f"missing {name}"):
            Scorer.from_pretrained(dst)
        (dst / name).write_bytes(original)
    Scorer.from_pretrained(dst)  # restored: loads again


def test_a_train_checkpoint_lists_its_files_and_the_loader_checks_them(trained):
    """Not only exports: a train checkpoint (what evaluate, simulate and blend score with) lists its
    config and tokenizer files too, so an edited config.json is refused instead of scoring silently."""
    from pipeline.serving.scorer import FILES_SHA256, Scorer

    ckpt = trained / "models/m/pairwise"
    meta = json.loads((ckpt / META).read_text())
    assert set(meta[FILES_SHA256]) == {p.name for p in ckpt.iterdir() if p.name != META}
    assert meta[FILES_SHA256][WEIGHTS] == meta["weights_sha256"]
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    with pytest.raises(CheckpointError, match="config.json sha256 .* changed after the checkpoint was written"):
        Scorer.from_pretrained(ckpt)


def test_export_records_the_median_val_score_where_unscored_requests_wait(trained):
    import pandas as pd

    from pipeline.contracts import PROMPTS, write_table
    from pipeline.serving.scorer import Scorer

    texts = ["say hi", "write a long story about a dragon", "list three colors", "explain tcp in depth", "ok"]
    prompts = pd.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in range(7)],
            "dataset": ["d"] * 7,
            "prompt": [*texts, "a test prompt", texts[0]],  # a duplicate val prompt counts once
            "split": ["val"] * 5 + ["test", "val"],
            "source_id": [str(i) for i in range(7)],
        }
    )
    path = write_table(prompts, trained / "prompts.parquet", PROMPTS)
    dst = _export(trained, prompts_file=path)
    scorer = Scorer.from_pretrained(dst)  # pars.json's addition keeps the file hashes valid
    expected = float(np.median(Scorer.from_pretrained(trained / "models/m/pairwise").score(texts)))
    assert json.loads((dst / META).read_text())["typical_score"]["n_prompts"] == 5
    assert scorer.typical_score == pytest.approx(expected, abs=1e-6)
    assert Scorer.from_pretrained(_export(trained)).typical_score is None  # no prompts: none recorded
    meta = json.loads((dst / META).read_text())
    for bad in ({"median": float("nan")}, {"median": "high"}, 3.0):
        (dst / META).write_text(json.dumps({**meta, "typical_score": bad}))
        with pytest.raises(CheckpointError, match="typical_score"):
            Scorer.from_pretrained(dst)
    with pytest.raises(FileNotFoundError, match="run prepare first"):
        _export(trained, prompts_file=trained / "absent.parquet")
    no_val = write_table(prompts.assign(split="test"), trained / "no_val.parquet", PROMPTS)
    (dst / META).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="no val prompts"):
        _export(trained, prompts_file=no_val)
    assert json.loads((dst / META).read_text()) == meta  # the last export stays whole


def test_sha256_file_matches_hashlib_across_chunks(tmp_path):
    import hashlib

    from pipeline.hashing import CHUNK

    data = bytes(range(256)) * (CHUNK // 256 * 2 + 3)  # two whole chunks and a partial one
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    path.write_bytes(data[:-1] + b"\x00")
    assert sha256_file(path) != hashlib.sha256(data).hexdigest()
