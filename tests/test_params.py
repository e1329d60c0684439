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
