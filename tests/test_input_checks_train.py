"""Bad input to `pars train` and the scorer's Python API: one clear line naming the file or key,
never a traceback or a silently wrong number, found before the slow work. Splits that disagree
between labels.parquet and prompts.parquet, pairs that cross splits, encoder directories with
missing tensors or damaged files, a bare str or a lone surrogate given to `Scorer.score`."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import one_line_error, params_file, run_cli, write_dataset, write_params

from pipeline.contracts import LABELS, PAIRS, PROMPTS, labels_path, pairs_dir, prompts_path, read_table, write_table
from pipeline.pairs import main as pairs_main


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no hub request from a test


@pytest.fixture
def toy_data(tmp_path):
    """data/ of the toy model (prompts, generations, pairs), fresh for each test to damage."""
    data = tmp_path / "data"
    write_dataset(data, n_train=12, n_val=8, n_test=4)
    params = write_params(tmp_path / "pairs-params.yaml", partners=3)
    args = ["--model", "toy", "--params", params, "--data", data, "--metrics", tmp_path / "metrics"]
    assert pairs_main([str(a) for a in args]) == 0
    return data


def damaged_copy(tiny_encoder_dir, tmp_path, change):
    out = tmp_path / "encoder"
    shutil.copytree(tiny_encoder_dir, out)
    change(out)
    return out


def cut(name):
    def change(root):
        data = (root / name).read_bytes()
        (root / name).write_bytes(data[: len(data) // 2])

    return change


def drop_tensors(prefix):
    def change(root):
        from safetensors.torch import load_file, save_file

        kept = {k: v for k, v in load_file(root / "model.safetensors").items() if not k.startswith(prefix)}
        save_file(kept, root / "model.safetensors", metadata={"format": "pt"})

    return change


def train_cli(capsys, tmp_path, encoder, data):
    params = params_file(tmp_path, "train", {"encoder": str(encoder), "frozen_layers": 0, "max_length": 16})
    return run_cli(
        capsys,
        "train",
        "--model",
        "toy",
        "--method",
        "pointwise",
        "--params",
        params,
        "--data",
        data,
        "--models",
        tmp_path / "models",
        "--metrics",
        tmp_path / "metrics-train",
        "--plots",
        tmp_path / "plots",
    )


# ---------------------------------------------------------------- splits


def test_a_label_split_other_than_the_prompts_split_is_refused(toy_data):
    """A test prompt relabelled train in labels.parquet would be trained on, then scored as unseen."""
    from pipeline.ranking.data import RankingData

    path = labels_path("toy", toy_data)
    labels = read_table(path, LABELS)
    labels.loc[labels["prompt_id"] == "test001", "split"] = "train"
    write_table(labels, path, LABELS)
    with pytest.raises(ValueError) as err:
        RankingData.load("toy", toy_data)
    message = str(err.value)
    assert str(path) in message and str(prompts_path(toy_data)) in message
    assert "1 prompt(s)" in message and "'test001'" in message


def test_prompts_marked_test_in_prompts_parquet_are_refused(toy_data):
    from pipeline.ranking.data import RankingData

    path = prompts_path(toy_data)
    prompts = read_table(path, PROMPTS)
    prompts.loc[prompts["prompt_id"].isin(["train000", "train001"]), "split"] = "test"
    write_table(prompts, path, PROMPTS)
    with pytest.raises(ValueError, match=r"2 prompt\(s\) have another split.*'train000': train here, test there"):
        RankingData.load("toy", toy_data)


def test_a_pair_that_crosses_splits_names_the_pairs_file(toy_data):
    from pipeline.ranking.data import RankingData

    path = pairs_dir("toy", toy_data) / "train.parquet"
    pairs = read_table(path, PAIRS)
    pairs.loc[0, "b"] = "val000"
    write_table(pairs, path, PAIRS)
    with pytest.raises(ValueError) as err:
        RankingData.load("toy", toy_data)
    message = str(err.value)
    assert message.startswith(f"{path}: 1 train pair(s) cross splits")
    assert "'val000' is a val prompt" in message and "no label" not in message


def test_a_pair_with_an_unlabelled_prompt_says_so(toy_data):
    from pipeline.ranking.data import RankingData

    path = pairs_dir("toy", toy_data) / "val.parquet"
    pairs = read_table(path, PAIRS)
    pairs.loc[1, "a"] = "nowhere"
    write_table(pairs, path, PAIRS)
    with pytest.raises(ValueError, match=r"val\.parquet: 1 val pair\(s\).*'nowhere' is not in .*labels\.parquet"):
        RankingData.load("toy", toy_data)


def test_consistent_splits_load_as_before(toy_data):
    from pipeline.ranking.data import RankingData

    data = RankingData.load("toy", toy_data)
    assert len(data.train_pairs) > 0 and len(data.val_pairs) > 0
    assert set(data.labels["split"]) == {"train", "val", "test"}


# ---------------------------------------------------------------- encoder tensors


def test_an_encoder_missing_tensors_is_refused_naming_the_dir_and_keys(tiny_encoder_dir, tmp_path):
    from pipeline.errors import PARSError
    from pipeline.ranking.model import LengthRanker

    broken = damaged_copy(tiny_encoder_dir, tmp_path, drop_tensors("encoder.layer.1."))
    with pytest.raises(PARSError, match=rf"encoder {broken}: the weights lack 16 tensor\(s\).*encoder\.layer\.1\."):
        LengthRanker.from_pretrained_encoder(str(broken))


def test_pars_train_refuses_missing_tensors_in_one_line_before_the_data(tiny_encoder_dir, tmp_path, capsys):
    broken = damaged_copy(tiny_encoder_dir, tmp_path, drop_tensors("encoder.layer.1."))
    rc, out, err = train_cli(capsys, tmp_path, broken, tmp_path / "no-data")
    line = one_line_error(rc, err, "train", broken)
    assert "encoder.layer.1." in line and "MISSING" not in out + err


def test_an_encoder_without_a_pooler_still_loads(tiny_encoder_dir, tmp_path, capsys):
    """The ranker pools the hidden states itself: a sentence-embedding checkpoint lacks the pooler."""
    from pipeline.ranking.model import LengthRanker, load_encoder

    whole = load_encoder(str(tiny_encoder_dir)).state_dict()
    plain = damaged_copy(tiny_encoder_dir, tmp_path, drop_tensors("pooler."))
    model = LengthRanker.from_pretrained_encoder(str(plain))
    for key, value in model.encoder.state_dict().items():
        if not key.startswith("pooler."):
            assert torch.equal(value, whole[key]), key
    assert "MISSING" not in "".join(capsys.readouterr())


@pytest.mark.packaged
def test_the_packaged_encoder_lacks_nothing_the_ranker_uses():
    from pipeline.ranking.model import load_encoder

    assert load_encoder("minilm-l6").config.num_hidden_layers == 6


# ---------------------------------------------------------------- damaged encoder files


@pytest.mark.parametrize(
    "change, name",
    [
        (cut("tokenizer.json"), "tokenizer.json"),
        (cut("tokenizer_config.json"), "tokenizer_config.json"),
        (cut("config.json"), "config.json"),
        (cut("model.safetensors"), "model.safetensors"),
    ],
)
def test_a_damaged_encoder_file_fails_in_one_line_naming_it_before_the_data(
    tiny_encoder_dir, tmp_path, capsys, change, name
):
    broken = damaged_copy(tiny_encoder_dir, tmp_path, change)
    rc, _, err = train_cli(capsys, tmp_path, broken, tmp_path / "no-data")
    assert rc == 1
    one_line_error(rc, err, "train", broken / name)


def test_an_empty_vocab_fails_in_one_line_naming_it(tiny_encoder_dir, tmp_path, capsys):
    def vocab_only_empty(root):
        (root / "tokenizer.json").unlink()
        (root / "vocab.txt").write_text("")

    broken = damaged_copy(tiny_encoder_dir, tmp_path, vocab_only_empty)
    rc, _, err = train_cli(capsys, tmp_path, broken, tmp_path / "no-data")
    assert rc == 1
    one_line_error(rc, err, "train", broken / "vocab.txt")


def test_the_whole_encoder_passes_the_checks_and_the_data_comes_next(tiny_encoder_dir, tmp_path, capsys):
    rc, _, err = train_cli(capsys, tmp_path, tiny_encoder_dir, tmp_path / "no-data")
    one_line_error(rc, err, "train", "no pairs for model 'toy'")


# ---------------------------------------------------------------- the scorer's Python API


def test_score_refuses_a_bare_str(tiny_checkpoint):
    from pipeline.serving.scorer import Scorer, score_together

    scorer = Scorer.from_pretrained(tiny_checkpoint)
    for call in (
        scorer.score,
        scorer.encode,
        lambda t: list(scorer.score_parts(t)),
        lambda t: score_together([scorer], t),
    ):
        with pytest.raises(TypeError, match="one str; pass a list"):
            call("a prompt")


def test_a_lone_surrogate_scores_as_a_replacement_and_the_rest_is_unchanged(tiny_checkpoint):
    from pipeline.serving.scorer import Scorer

    scorer = Scorer.from_pretrained(tiny_checkpoint)
    normal = ["please write an essay", "café au lait", "一 two 三 😀"]
    before = scorer.score(normal, batch_size=1)  # one prompt a batch: no padding to change the rounding
    got = scorer.score([*normal, "broken \ud800 text"], batch_size=1)
    np.testing.assert_array_equal(got[:3], before)
    assert got[3] == scorer.score(["broken ? text"])[0]


def test_pars_score_still_refuses_a_lone_surrogate_naming_the_line(tiny_checkpoint, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "fine"}\n{"prompt": "bad \\ud800"}\n', encoding="utf-8")
    rc, _, err = run_cli(capsys, "score", src, "--checkpoint", tiny_checkpoint)
    line = one_line_error(rc, err, "score", "in.jsonl:2")
    assert "lone UTF-16 surrogate" in line


def test_pair_indices_of_a_table_built_elsewhere_says_what_is_wrong():
    from pipeline.ranking.data import PromptTable, pair_indices

    table = PromptTable(np.array(["a", "b"]), [[1], [2]], np.ones(2), np.zeros(2, bool))
    pairs = pd.DataFrame({"a": ["a"], "b": ["c"]})
    with pytest.raises(ValueError, match="'c' is not among this split's labelled prompts"):
        pair_indices(pairs, table, "train.parquet")
