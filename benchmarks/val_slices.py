"""Where a trained predictor ranks worse: its Kendall tau_b on slices of an eval model's val split
(prompts the encoder sees whole or cut to head and tail, non-ASCII prompts, code, short answers),
whether adding the log prompt length to its score would help, and the answer lengths by score
decile. Val only: the test split is for evaluate's final figures.

    python benchmarks/val_slices.py                                   # chatgpt/pairwise on ChatGPT's val
    python benchmarks/val_slices.py --checkpoint models/recorded/pairwise --out /tmp/slices.json

Writes metrics/choices/val_slices-<model>-<train model>-<method>.json by default.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.contracts import generations_path, prompts_path, write_json  # noqa: E402
from pipeline.ranking.labels import prompt_labels  # noqa: E402
from pipeline.ranking.metrics import kendall_tau_b  # noqa: E402

CODE = re.compile(r"```|\bdef |\bfunction |\bclass |\bimport |[{};]\s*$", re.M)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="chatgpt", help="eval model whose val answers rank the prompts")
    ap.add_argument("--checkpoint", default="models/chatgpt/pairwise", help="a checkpoint written by pars train")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from pipeline.serving.scorer import Scorer

    ckpt = Path(args.checkpoint)
    for path in (prompts_path(), generations_path(args.model), ckpt / "pars.json"):
        if not path.is_file():
            sys.exit(f"val_slices: {path} not found (run `dvc repro`, or check --model / --checkpoint)")
    prompts = pd.read_parquet(prompts_path()).drop_duplicates("prompt_id").set_index("prompt_id")
    labels = prompt_labels(pd.read_parquet(generations_path(args.model))).set_index("prompt_id")
    val = labels.join(prompts[["split", "prompt"]], how="inner")
    val = val[val["split"] == "val"].copy()
    scorer = Scorer.from_pretrained(ckpt)
    print(f"val_slices: scoring {len(val)} {args.model} val prompts with {ckpt}", flush=True)
    val["score"] = scorer.score(val["prompt"].tolist())
    # the encoder's own count of a prompt's tokens: above its max_length it sees head and tail only
    val["prompt_tokens"] = [
        len(ids) for ids in scorer.tokenizer(val["prompt"].tolist(), add_special_tokens=False)["input_ids"]
    ]
    ascii_share = val["prompt"].map(lambda p: sum(c.isascii() for c in p) / max(1, len(p)))

    def tau(mask) -> dict:
        part = val[np.asarray(mask)]
        return {
            "n_prompts": len(part),
            "val_tau_b": round(kendall_tau_b(part["score"].to_numpy(), part["length"].to_numpy()), 4),
            "median_answer_tokens": float(part["length"].median()),
        }

    seen_whole = val["prompt_tokens"] <= scorer.max_length
    slices = {
        "all": tau(np.ones(len(val), bool)),
        f"prompt <= {scorer.max_length} tokens (seen whole)": tau(seen_whole),
        f"prompt > {scorer.max_length} tokens (head and tail)": tau(~seen_whole),
        "prompt > 512 tokens": tau(val["prompt_tokens"] > 512),
        "mostly ASCII (> 95% of characters)": tau(ascii_share > 0.95),
        "non-ASCII": tau(ascii_share <= 0.95),
        "prompt holds code": tau(val["prompt"].str.contains(CODE)),
        "answer <= 30 tokens (tau within)": tau(val["length"] <= 30),
    }
    short = val["length"] <= 30
    pct = val["score"].rank(pct=True)
    z = (val["score"] - val["score"].mean()) / val["score"].std()
    log_len = np.log1p(val["prompt_tokens"])
    z_len = (log_len - log_len.mean()) / log_len.std()
    with_length = {
        str(w): round(kendall_tau_b((z + w * z_len).to_numpy(), val["length"].to_numpy()), 4)
        for w in (0.0, 0.1, 0.2, 0.3, 0.5)
    }
    deciles = val.assign(decile=pd.qcut(val["score"], 10, labels=False)).groupby("decile")["length"]
    result = {
        "question": "Where does the predictor rank worse on val, and would the prompt's length (which the "
        "encoder cannot see past max_length) add to its score?",
        "checkpoint": str(ckpt),
        "eval_model": args.model,
        "split": "val",
        "command": " ".join(["python benchmarks/val_slices.py", *(argv if argv is not None else sys.argv[1:])]),
        "slices": slices,
        "tau_b_prompt_length_alone": round(kendall_tau_b(val["prompt_tokens"].to_numpy(), val["length"].to_numpy()), 4),
        "tau_b_score_plus_w_log_prompt_length": with_length,
        "short_answers_by_score_percentile": {
            "answers <= 30 tokens": int(short.sum()),
            "in the lowest 10% of scores": int((pct[short] <= 0.1).sum()),
            "in the lowest 25%": int((pct[short] <= 0.25).sum()),
            "in the upper half": int((pct[short] > 0.5).sum()),
        },
        "answer_tokens_by_score_decile": {
            str(d): {"p25": float(g.quantile(0.25)), "median": float(g.median()), "p75": float(g.quantile(0.75))}
            for d, g in deciles
        },
    }
    out = Path(args.out or f"metrics/choices/val_slices-{args.model}-{ckpt.parent.name}-{ckpt.name}.json")
    write_json(result, out)
    for name, s in slices.items():
        print(f"{name:45s} n={s['n_prompts']:5d} tau_b={s['val_tau_b']:.3f}")
    print(f"score + w * log prompt length: {with_length}")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
