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


def test_a_number_yaml_reads_as_text_is_refused_saying_why(tmp_path, capsys):
    """PyYAML reads `3e-4` (no dot) as a string: still refused (DVC's params would see a string too),
    but the line says why and how to write it."""
    from helpers import one_line_error, run_cli, write_params

    from pipeline.errors import PARSError

    path = tmp_path / "params.yaml"
    path.write_text("train:\n  lr: 3e-4\n  warmup: '0.5'\n  lrs: [1.0e-4, 2e-1]\n  name: fast\n  wd: '3.5e-4'\n")
    p = load_params("train", path)
    with pytest.raises(
        PARSError, match=r"train\.lr '3e-4': must be a number \(YAML reads 3e-4 as text: write 3\.0e-4\)$"
    ):
        p.number("lr")
    with pytest.raises(PARSError, match=r"train\.warmup '0\.5': must be a number \(a quoted string"):
        p.number("warmup")
    with pytest.raises(ValueError, match=r"train\.lrs\[1\] '2e-1': .*\(YAML reads 2e-1 as text: write 2\.0e-1\)$"):
        p.numbers("lrs")
    with pytest.raises(PARSError, match=r"train\.name 'fast': must be a number$"):  # no note: not a number
        p.number("name")
    with pytest.raises(PARSError, match=r"train\.wd '3\.5e-4': must be a number \(a quoted string"):  # YAML's float
        p.number("wd")

    params = write_params(tmp_path / "pairs.yaml")
    params.write_text(params.read_text().replace("delta: 0.2", "delta: 1e-1"))
    rc, _, err = run_cli(capsys, "pairs", "--model", "toy", "--params", params, "--data", tmp_path / "no-data")
    one_line_error(rc, err, "pairs", "pairs.delta '1e-1': must be a number (YAML reads 1e-1 as text: write 1.0e-1)")


def test_a_key_written_twice_is_refused_naming_the_file_and_line(tmp_path, capsys):
    """PyYAML keeps the last of two equal keys silently (ruamel, DVC's reader, refuses the file)."""
    from helpers import one_line_error, run_cli, write_params

    from pipeline.errors import PARSError
    from pipeline.params import read_yaml

    params = write_params(tmp_path / "params.yaml")
    text = params.read_text()
    params.write_text(text.replace("  delta: 0.2\n", "  delta: 0.2\n  delta: 0.3\n"))
    line = text.splitlines().index("  delta: 0.2") + 2
    rc, _, err = run_cli(capsys, "pairs", "--model", "toy", "--params", params, "--data", tmp_path / "no-data")
    one_line_error(
        rc, err, "pairs", f"{params}:{line}:3: not valid YAML (key 'delta' written twice, first on line {line - 1})"
    )

    flow = tmp_path / "flow.yaml"
    flow.write_text("train: {lr: 0.1, lr: 0.2}\n")
    with pytest.raises(PARSError, match=rf"{flow}:1:\d+: not valid YAML \(key 'lr' written twice"):
        read_yaml(flow)
    # equal keys in different mappings, and a key overriding one merged in with `<<`, are fine
    ok = tmp_path / "ok.yaml"
    ok.write_text("a: &base {x: 1, y: 2}\nb:\n  <<: *base\n  x: 3\nc: {x: 1}\n")
    assert read_yaml(ok) == {"a": {"x": 1, "y": 2}, "b": {"x": 3, "y": 2}, "c": {"x": 1}}
    # a mapping that merges one that merges another: the middle one's override is not a repeat
    nested = tmp_path / "nested.yaml"
    nested.write_text("s: &s {lr: 0}\ndefaults:\n  train: &t\n    <<: *s\n    lr: 1\nother:\n  <<: *t\n")
    assert read_yaml(nested) == {"s": {"lr": 0}, "defaults": {"train": {"lr": 1}}, "other": {"lr": 1}}


def test_a_stale_pars_params_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.setenv("PARS_PARAMS", str(tmp_path / "nope.yaml"))
    with pytest.raises(FileNotFoundError, match=r"params file not found: .*nope\.yaml \(\$PARS_PARAMS\)$"):
        load_params("train")
    with pytest.raises(FileNotFoundError, match=r"params file not found: .*other\.yaml$"):  # --params: no mention
        load_params("train", tmp_path / "other.yaml")
