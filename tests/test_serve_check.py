"""`pars serve-check`: the scheduler's settings, checkpoint and vLLM version checked without an engine."""

from __future__ import annotations

import json

import pytest
from helpers import one_line_error, run_cli


@pytest.fixture
def clean_env(monkeypatch):
    """No PARS_* setting of the caller's shell leaks into the check."""
    import os

    for key in [k for k in os.environ if k.startswith("PARS_")]:
        monkeypatch.delenv(key)


def _config(**pars) -> str:
    return json.dumps({"pars": pars})


def test_a_good_setup_prints_the_settings_and_scores(capsys, tiny_checkpoint, clean_env, monkeypatch):
    import pipeline.serve_check as check

    monkeypatch.setattr(check, "installed_vllm", lambda: "0.32.0+cpu")  # whether or not an extra is installed
    rc, out, err = run_cli(capsys, "serve-check", "--additional-config", _config(checkpoint=str(tiny_checkpoint)))
    assert rc == 0, err
    assert (
        "vLLM: 0.32.0+cpu (tested range)" in out
        and "starvation_s: 120.0" in out
        and out.rstrip().splitlines()[-1].startswith("ok:")
    )


def test_the_environment_is_read_as_the_scheduler_reads_it(capsys, tiny_checkpoint, clean_env, monkeypatch):
    monkeypatch.setenv("PARS_CHECKPOINT", str(tiny_checkpoint))
    monkeypatch.setenv("PARS_STARVATION_S", "inf")
    rc, out, err = run_cli(capsys, "serve-check")
    assert rc == 0, err
    assert "starvation_s: inf" in out


@pytest.mark.parametrize(
    "config, env, named",
    [
        ('{"pars": {"starvation_s": inf}}', {}, "--additional-config: not valid JSON"),
        ('["pars"]', {}, "additional_config must be a JSON object"),
        ("{}", {}, "needs a checkpoint: pass --additional-config"),
        (_config(checkpoint="CKPT", batch_size=-1), {}, "additional_config['pars']['batch_size']"),
        (_config(checkpoint="CKPT", score_key=" pars_score"), {}, "has spaces around it"),
        (_config(checkpoint="CKPT"), {"PARS_BATCHSIZE": "3"}, "PARS_BATCHSIZE: not a PARS setting"),
        (_config(checkpoint="PARENT"), {}, "missing pars.json; checkpoints inside it"),
    ],
)
def test_a_bad_setup_is_one_line(capsys, tiny_checkpoint, clean_env, monkeypatch, config, env, named):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = config.replace("CKPT", str(tiny_checkpoint)).replace("PARENT", str(tiny_checkpoint.parent))
    rc, _, err = run_cli(capsys, "serve-check", "--additional-config", config)
    one_line_error(rc, err, "serve-check", named)


def test_an_untested_vllm_is_refused_unless_allowed(capsys, tiny_checkpoint, clean_env, monkeypatch):
    import pipeline.serve_check as check

    monkeypatch.setattr(check, "installed_vllm", lambda: "0.40.1")
    config = _config(checkpoint=str(tiny_checkpoint))
    rc, _, err = run_cli(capsys, "serve-check", "--additional-config", config)
    one_line_error(rc, err, "serve-check", "the installed vLLM is 0.40.1")
    monkeypatch.setenv("PARS_ALLOW_UNTESTED_VLLM", "1")
    rc, out, err = run_cli(capsys, "serve-check", "--additional-config", config)
    assert rc == 0 and "0.40.1 (untested; allowed by PARS_ALLOW_UNTESTED_VLLM=1)" in out, err
