"""params.yaml is the one home of defaults: a key it lacks fails in one line naming file and key."""

from __future__ import annotations

import copy
import pickle

import pytest

from pipeline.params import MissingParam, load_params


def test_a_missing_key_names_the_file_and_the_dotted_key(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  epochs: 2\n  lightning: {accelerator: cpu}\n")
    p = load_params("train", path)
    assert p["epochs"] == 2 and p.get("lr") is None  # .get stays for keys whose absence means something
    with pytest.raises(KeyError) as err:
        p["lr"]
    assert str(err.value) == f"{path}: train.lr is missing"
    for section in (p, copy.deepcopy(p), pickle.loads(pickle.dumps(p))):  # DataLoader workers, deep copies
        with pytest.raises(MissingParam, match=r"train\.lightning\.devices is missing$"):
            section["lightning"]["devices"]


def test_the_cli_reports_a_missing_key_in_one_line(tmp_path, capsys):
    from pipeline.cli import main as pars

    path = tmp_path / "params.yaml"
    path.write_text("capacity: {M: 131000, chunk: 512, margin: 0.1}\n")
    assert pars(["capacity", "--rate", "1", "--params", str(path)]) == 1
    assert capsys.readouterr().err == f"pars capacity: error: {path}: capacity.step_time is missing\n"


def test_pars_params_under_dvc_must_be_the_tracked_file(tmp_path, monkeypatch):
    """DVC sets DVC_STAGE and tracks params.yaml: another $PARS_PARAMS would run the stage on settings
    that dvc.lock and `dvc exp run -S` never see, so it is refused; outside DVC it is read as asked."""
    from pipeline.errors import PARSError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("train: {epochs: 2}\n")
    (tmp_path / "other.yaml").write_text("train: {epochs: 9}\n")
    monkeypatch.setenv("PARS_PARAMS", "other.yaml")
    monkeypatch.delenv("DVC_STAGE", raising=False)
    assert load_params("train")["epochs"] == 9
    monkeypatch.setenv("DVC_STAGE", "train@chatgpt")
    with pytest.raises(PARSError, match="PARS_PARAMS=other.yaml is set while DVC runs stage train@chatgpt"):
        load_params("train")
    assert load_params("train", "other.yaml")["epochs"] == 9  # an explicit --params is the user's choice
    monkeypatch.setenv("PARS_PARAMS", str(tmp_path / "params.yaml"))  # the tracked file itself
    assert load_params("train")["epochs"] == 2
