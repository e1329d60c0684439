"""`pars lengths` after a profile switch: DVC keeps the folders of models the new profile no longer
generates (data/generations/smollm2, chatgpt, ...). Found, not named, such a folder (answers to none of
the prompts table's prompts) is skipped and named in one printed line; a folder that is partly stale,
or one named with --models, is still refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from helpers import one_line_error, run_cli

from pipeline.contracts import GENERATIONS, PROMPTS, write_table


def _prompts(path: Path, ids: list[str], dataset: str = "alpaca") -> Path:
    df = pd.DataFrame(
        {
            "prompt_id": ids,
            "dataset": [dataset] * len(ids),
            "prompt": [f"prompt {i}" for i in ids],
            "split": ["test"] * len(ids),
            "source_id": [str(i) for i in range(len(ids))],
        }
    )
    return write_table(df, path, PROMPTS)


def _generations(root: Path, model: str, ids: list[str], tokens: list[int]) -> Path:
    """root/<model>/generations.parquet: two samples of each prompt in `ids`, of `tokens` (one per row)."""
    rows = [pid for pid in ids for _ in range(2)]
    df = pd.DataFrame(
        {
            "prompt_id": rows,
            "sample": [s for _ in ids for s in (0, 1)],
            "output_tokens": tokens,
            "reasoning_tokens": [0] * len(rows),
            "finish_reason": ["stop"] * len(rows),
            "prompt_tokens": [5] * len(rows),
            "text": ["x"] * len(rows),
            "reasoning": [""] * len(rows),
        }
    )
    return write_table(df, root / model / "generations.parquet", GENERATIONS)


def _lengths(capsys, tmp_path: Path, *extra) -> tuple[int, str, str]:
    return run_cli(
        capsys,
        *("lengths", "--generations", tmp_path / "gens", "--prompts", tmp_path / "prompts.parquet"),
        *("--metrics", tmp_path / "lengths.json", "--plot", tmp_path / "lengths.png"),
        *extra,
    )


def _switched(tmp_path: Path) -> None:
    """The production prompts table, the production model's answers, and two folders a default run left."""
    _prompts(tmp_path / "prompts.parquet", ["a0", "a1"])
    _generations(tmp_path / "gens", "llama-3-1-8b", ["a0", "a1"], [10, 20, 30, 40])
    _generations(tmp_path / "gens", "smollm2", ["d0", "d1"], [1, 2, 3, 4])
    _generations(tmp_path / "gens", "chatgpt", ["d2"], [7, 9])


def test_lengths_skips_the_folders_another_profile_left_and_names_them(tmp_path, capsys):
    _switched(tmp_path)
    rc, out, err = _lengths(capsys, tmp_path)
    assert rc == 0, err
    table = json.loads((tmp_path / "lengths.json").read_text())
    assert list(table) == ["llama-3-1-8b"]
    assert table["llama-3-1-8b"]["all"]["mean_output_tokens"] == 25.0 and set(table["llama-3-1-8b"]) == {
        "all",
        "alpaca",
    }
    assert (tmp_path / "lengths.png").stat().st_size > 0
    skipped = [line for line in out.splitlines() if "skipped" in line]
    assert len(skipped) == 1, out  # one line, naming every skipped folder
    assert "2 folder(s)" in skipped[0] and "chatgpt, smollm2" in skipped[0] and str(tmp_path / "gens") in skipped[0]


def test_lengths_without_any_folder_for_these_prompts_is_one_line(tmp_path, capsys):
    _switched(tmp_path)
    (tmp_path / "gens" / "llama-3-1-8b" / "generations.parquet").unlink()
    rc, _, err = _lengths(capsys, tmp_path)
    one_line_error(rc, err, "lengths", "answer the prompts table's prompts")
    assert not (tmp_path / "lengths.json").exists()


def test_lengths_still_refuses_a_partly_stale_folder_and_a_named_stale_one(tmp_path, capsys):
    _switched(tmp_path)
    # named with --models: described or refused, never skipped
    rc, _, err = _lengths(capsys, tmp_path, "--models", "llama-3-1-8b", "smollm2")
    line = one_line_error(rc, err, "lengths", tmp_path / "gens" / "smollm2" / "generations.parquet")
    assert "not in the prompts table" in line and not (tmp_path / "lengths.json").exists()
    # some answers to these prompts, some to others: damaged or half-regenerated, not another profile's
    _generations(tmp_path / "gens", "llama-3-1-8b", ["a0", "d0"], [10, 20, 30, 40])
    rc, _, err = _lengths(capsys, tmp_path)
    line = one_line_error(rc, err, "lengths", tmp_path / "gens" / "llama-3-1-8b" / "generations.parquet")
    assert "1 prompt_id(s) are not in the prompts table" in line and not (tmp_path / "lengths.json").exists()


def test_lengths_plot_without_a_suffix_is_refused_before_the_metrics_are_replaced(tmp_path, capsys):
    _switched(tmp_path)
    metrics = tmp_path / "lengths.json"
    metrics.write_text("{}\n")
    rc, _, err = _lengths(capsys, tmp_path, "--plot", tmp_path / "lplot")
    line = one_line_error(rc, err, "lengths", f"--plot {tmp_path / 'lplot'}")
    assert "no suffix" in line and "png" in line
    assert metrics.read_text() == "{}\n" and not (tmp_path / "lplot").exists()


def test_write_figure_names_the_format_rather_than_guessing_it_from_the_temp_name(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.contracts import write_figure

    fig, _ = plt.subplots()
    write_figure(fig, tmp_path / "plain")  # no suffix: matplotlib's default format, as savefig would
    write_figure(fig, tmp_path / "f.svg")
    plt.close(fig)
    assert (tmp_path / "plain").read_bytes().startswith(b"\x89PNG")
    assert b"<svg" in (tmp_path / "f.svg").read_bytes()[:1000]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.svg", "plain"]  # no temp file left
