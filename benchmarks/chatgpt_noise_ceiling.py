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

from pipeline.params import load_params  # noqa: E402
from pipeline.prepare import normalise, prompt_id  # noqa: E402
from pipeline.ranking.metrics import noise_ceiling  # noqa: E402
from pipeline.sources import get_source  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="metrics/choices/chatgpt_noise_ceiling.json")
    args = ap.parse_args(argv)

    replies: dict[str, list[str]] = collections.defaultdict(list)
    for rec in get_source("sharegpt").records():
        if rec.problem is None and rec.prompt and normalise(rec.prompt) and "chatgpt" in rec.answers:
            replies[prompt_id("sharegpt", rec.prompt)].append(rec.answers["chatgpt"])
    repeated = {pid: texts for pid, texts in replies.items() if len(texts) > 1}
    distinct = {pid: list(dict.fromkeys(texts)) for pid, texts in repeated.items()}
    sampled = {pid: texts for pid, texts in distinct.items() if len(texts) > 1}

    from transformers import AutoTokenizer

    from pipeline.encoders import resolve_encoder

    tokenizer_name = load_params("generate")["recorded_tokenizer"]
    tokenizer = AutoTokenizer.from_pretrained(resolve_encoder(tokenizer_name))
    tokenizer.model_max_length = 10**9  # counting only
    # the first two distinct replies of each prompt (file order): a few prompts ("hi") have hundreds,
    # and averaging over every column pair would weight those few prompts most
    lengths = np.array(
        [
            [len(ids) for ids in tokenizer(texts[:2], add_special_tokens=False)["input_ids"]]
            for texts in sampled.values()
        ],
        dtype=float,
    )
    ceiling = noise_ceiling(lengths)
    ceiling.pop("_boot")
    result = {
        "model": "chatgpt",
        "dataset": "sharegpt",
        "what": "tau_b between the token lengths of two distinct ChatGPT replies to one ShareGPT first turn, "
        "on the first turns the file holds with distinct replies (all splits, not a random sample)",
        "command": "python benchmarks/chatgpt_noise_ceiling.py",
        "tokenizer": tokenizer_name,
        "distinct_first_turns_with_a_reply": len(replies),
        "first_turns_with_several_replies": len(repeated),
        "of_which_all_replies_identical": sum(len(texts) == 1 for texts in distinct.values()),
        "first_turns_with_distinct_replies": len(sampled),
        "most_distinct_replies_of_one_prompt": max(len(texts) for texts in sampled.values()),
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
    raise SystemExit(main())
