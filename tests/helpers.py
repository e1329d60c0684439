"""Helpers shared by several test files (imported as `from helpers import ...`; pytest puts tests/
on sys.path). Toy data for the pairs and train stages: prompts whose wording tells the answer
length. (`servers.py` holds the other shared helper set, the real `vllm serve` for engine tests.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.contracts import GENERATIONS, PROMPTS, generations_path, prompts_path, write_table

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def params_section(name: str, **overrides) -> dict:
    """The repository's params.yaml section `name` (plain dicts), top-level keys replaced by `overrides`.

    Stages take every key from params.yaml (no defaults in code): a test starts from the real
    section and sets what it is about, so a key added to params.yaml reaches the tests too."""
    import yaml

    return {**yaml.safe_load(PARAMS.read_text(encoding="utf-8"))[name], **overrides}


def backend_spec(backend: str, *, without: tuple[str, ...] = (), **overrides) -> dict:
    """A spec for the vllm or openai backend with every key it requires (pipeline.backends.REQUIRED:
    no defaults in code), taken from params.yaml's smollm2 entry (dtype `auto` for vllm, so that no
    test asks this CPU whether it computes bfloat16), then `overrides`; the keys in `without` left out.
    Without `model` (and the openai backend's `base_url`) unless given."""
    from pipeline.backends import REQUIRED

    smollm2 = params_section("generate")["models"]["smollm2"]
    spec = {key: smollm2[key] for key in REQUIRED[backend]}
    if backend == "vllm":
        spec["dtype"] = "auto"
    spec.update(overrides)
    return {key: value for key, value in spec.items() if key not in without}


WORDS = {"short": "brief", "long": "essay"}


def make_tables(n_train=30, n_val=12, n_test=6, k=2, seed=0, truncated=()):
    """Prompts whose wording tells their answer length: 'brief' ones are short, 'essay' ones long."""
    rng = np.random.default_rng(seed)
    prompts, gens = [], []
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        for i in range(n):
            pid = f"{split}{i:03d}"
            kind = "long" if i % 2 else "short"
            base = 300 if kind == "long" else 40
            base = base * (1 + 0.5 * rng.random())
            prompts.append(
                {
                    "prompt_id": pid,
                    "dataset": "toy" if i % 3 else "toy2",
                    "prompt": f"please write an {WORDS[kind]} about topic {i}",
                    "split": split,
                    "source_id": str(i),
                }
            )
            for s in range(k):
                cut = pid in truncated and s == 0  # one sample cut: the mean is a lower bound
                gens.append(
                    {
                        "prompt_id": pid,
                        "sample": s,
                        "output_tokens": int(512 if cut else base * (1 + 0.1 * rng.standard_normal())),
                        "reasoning_tokens": 0,
                        "finish_reason": "length" if cut else "stop",
                        "prompt_tokens": 10,
                        "text": "x",
                        "reasoning": "",
                    }
                )
    return pd.DataFrame(prompts), pd.DataFrame(gens)


def write_dataset(root, model="toy", **kw):
    """make_tables(**kw) written as the prepare and generate stages' files under `root`."""
    prompts, gens = make_tables(**kw)
    write_table(prompts, prompts_path(root), PROMPTS)
    write_table(gens, generations_path(model, root), GENERATIONS)
    return prompts, gens


def write_params(path, **pairs):
    """A params file with only the `pairs` section (defaults overridden by `pairs`)."""
    import yaml

    conf = {"delta": 0.2, "partners": 4, "max_tries_factor": 10, "seed": 42, **pairs}
    path.write_text(yaml.safe_dump({"pairs": conf}))
    return path


# ---- the `pars` CLI driven in-process, for the bad-input tests


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """`pars <argv>` in this process: (exit code, stdout, stderr)."""
    from pipeline.cli import main as pars

    capsys.readouterr()
    rc = pars([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc: int, err: str, cmd: str, *names) -> str:
    """rc != 0 and stderr is one line `pars <cmd>: error: ...` naming one of `names`."""
    lines = err.splitlines()
    assert rc != 0 and len(lines) == 1 and lines[0].startswith(f"pars {cmd}: error: "), (rc, err)
    assert any(str(n) in lines[0] for n in names), (names, err)
    return lines[0]


def params_file(tmp_path: Path, section: str, changes: dict) -> Path:
    """tmp_path/params.yaml: the repository's params.yaml with `changes` ({"lightning.accelerator":
    "tpu", ...}, dotted into mappings) made in `section`."""
    import yaml

    data = yaml.safe_load(PARAMS.read_text(encoding="utf-8"))
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        node = data[section]
        for name in parents:
            node = node[name]
        node[key] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path
