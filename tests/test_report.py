"""`pars report`: where the page goes, and an estimated noise ceiling checked for every key the tables read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import one_line_error, run_cli

RANKING = '{"predictors": {}, "references": {}}'
CEILING = Path("metrics/choices/chatgpt_noise_ceiling.json")
GOOD_CEILING = {
    "model": "chatgpt",
    "dataset": "sharegpt",
    "what": "two replies of repeated prompts",
    "command": "python benchmarks/chatgpt_noise_ceiling.py",
    "noise_ceiling": {"kendall_tau_b": 0.6, "ci_low": 0.5, "ci_high": 0.7, "n_prompts": 100},
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ranking.json").write_text(RANKING)
    return tmp_path


def test_ranking_only_prints_and_leaves_the_stage_output_alone(capsys, workdir):
    rc, out, _ = run_cli(capsys, "report", "--ranking", "ranking.json", "--ranking-only")
    assert rc == 0 and out and "## Capacity" not in out
    assert not (workdir / "metrics").exists()  # metrics/report.md is the report stage's, with serving sections
    rc, out, _ = run_cli(capsys, "report", "--ranking", "ranking.json", "--ranking-only", "--out", "page.md")
    assert rc == 0 and (workdir / "page.md").read_text() == out  # written where asked
    rc, out, _ = run_cli(capsys, "report", "--ranking", "ranking.json")
    assert rc == 0 and (workdir / "metrics/report.md").read_text() == out  # the full page: the stage's file


@pytest.mark.parametrize(
    "drop, named",
    [("command", "'command'"), ("what", "'what'"), ("noise_ceiling.n_prompts", "'noise_ceiling.n_prompts'")],
)
def test_estimated_ceiling_missing_key_is_named(capsys, workdir, drop, named):
    ceiling = json.loads(json.dumps(GOOD_CEILING))
    *parents, key = drop.split(".")
    node = ceiling
    for name in parents:
        node = node[name]
    del node[key]
    (workdir / CEILING).parent.mkdir(parents=True)
    (workdir / CEILING).write_text(json.dumps(ceiling))
    rc, _, err = run_cli(capsys, "report", "--ranking", "ranking.json", "--ranking-only")
    assert f"has no {named}" in one_line_error(rc, err, "report", CEILING)
    (workdir / CEILING).write_text(json.dumps(GOOD_CEILING))
    assert run_cli(capsys, "report", "--ranking", "ranking.json", "--ranking-only")[0] == 0
