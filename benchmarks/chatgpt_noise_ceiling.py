"""ChatGPT's noise ceiling on ShareGPT, from the prompts the file holds more than once.

The recorded answers give one ChatGPT reply per prompt (k=1), so evaluate reports no noise ceiling
for ChatGPT. But about a thousand first turns open several conversations; most of those are one
conversation shared twice (identical replies), and some have distinct replies: independent samples
of ChatGPT's answer to one prompt. tau_b between the lengths of two such replies (tokens of the recorded
tokenizer, as generate counts them) says how much of a length ranking is noise: a predictor scored
against one sample per prompt can reach about this, or more (it ranks by the expected length).

The repeated prompts are not a random sample of ShareGPT (popular templates repeat), so this
is an estimate of the ceiling, not the ceiling of the test split. All splits are used: no
predictor is scored here.

    python benchmarks/chatgpt_noise_ceiling.py      # -> metrics/choices/chatgpt_noise_ceiling.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.backends.base import PromptItem  # noqa: E402
from pipeline.backends.recorded import RecordedBackend  # noqa: E402
from pipeline.params import load_params  # noqa: E402
from pipeline.prepare import prompt_id  # noqa: E402
from pipeline.ranking.metrics import noise_ceiling  # noqa: E402
from pipeline.sources import get_source  # noqa: E402
from pipeline.sources.base import normalise  # noqa: E402


def first_per_reply(records: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """(source id, text) of the first record of each distinct reply, in file order: the same
    conversation shared twice is one sample, not two."""
    seen: set[str] = set()
    kept = []
    for source_id, text, reply in records:
        if reply not in seen:
            seen.add(reply)
            kept.append((source_id, text))
    return kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="metrics/choices/chatgpt_noise_ceiling.json")
    args = ap.parse_args(argv)

    # every usable first turn with ChatGPT's reply, grouped by prompt id: (source id, text, reply)
    records: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)
    for rec in get_source("sharegpt").records():
        if rec.problem is None and rec.prompt and normalise(rec.prompt) and "chatgpt" in rec.answers:
            text = normalise(rec.prompt)
            records[prompt_id("sharegpt", text)].append((rec.source_id, text, rec.answers["chatgpt"]))
    repeated = {pid: recs for pid, recs in records.items() if len(recs) > 1}
    distinct = {pid: first_per_reply(recs) for pid, recs in repeated.items()}
    sampled = {pid: recs for pid, recs in distinct.items() if len(recs) > 1}

    # counted as the generate stage counts recorded answers: the same backend and tokenizer
    tokenizer_name = load_params("generate")["recorded_tokenizer"]
    backend = RecordedBackend({"source": "sharegpt:chatgpt", "recorded_tokenizer": tokenizer_name})
    # the first two distinct replies of each prompt: a few prompts ("hi") have hundreds, and
    # averaging over every column pair would weight those few prompts most
    items = [
        PromptItem(f"{pid}#{k}", text, "sharegpt", sid)
        for pid, recs in sampled.items()
        for k, (sid, text) in enumerate(recs[:2])
    ]
    tokens = {key: samples[0].output_tokens for key, samples in backend.generate(items)}
    lengths = np.array([[tokens[f"{pid}#{k}"] for k in range(2)] for pid in sampled], dtype=float)
    ceiling = noise_ceiling(lengths)
    ceiling.pop("_boot")
    result = {
        "model": "chatgpt",
        "dataset": "sharegpt",
        "what": "tau_b between the token lengths of two distinct ChatGPT replies to one ShareGPT first turn, "
        "on the first turns the file holds with distinct replies (all splits, not a random sample)",
        "command": "python benchmarks/chatgpt_noise_ceiling.py",
        "tokenizer": tokenizer_name,
        "distinct_first_turns_with_a_reply": len(records),
        "first_turns_with_several_replies": len(repeated),
        "of_which_all_replies_identical": sum(len(recs) == 1 for recs in distinct.values()),
        "first_turns_with_distinct_replies": len(sampled),
        "most_distinct_replies_of_one_prompt": max(len(recs) for recs in sampled.values()),
        "replies_used_per_prompt": 2,
        "median_tokens": float(np.nanmedian(lengths)),
        "noise_ceiling": ceiling,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"ChatGPT noise ceiling: tau_b {ceiling['kendall_tau_b']:.3f} "
        f"({ceiling['ci_low']:.3f}-{ceiling['ci_high']:.3f}) over {len(sampled)} repeated first turns "
        f"with distinct replies -> {out}"
    )
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
