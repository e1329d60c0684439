"""Could the scheduler close its gap to oracle SJF without a better ranking, by also using how long a
request has already run (attained service: preempt a running request whose expected remaining answer
has grown past a waiting one's, as least-attained-service and Gittins-index schedulers do)?

That pays only where a running request comes to expect more remaining answer than the requests
waiting behind it expect in all. This measures, on a model's val split, the mean remaining answer
E[L - g | L > g] of the requests in each score decile of a predictor after g generated tokens. In a
burst served in score order, the requests waiting while decile d runs are of decile d + 1 and up: if no
decile's remaining answer ever exceeds the next decile's at its start, a shortest-expected-remaining-
first scheduler would not preempt, and the gap to oracle SJF is the ranking's alone (val split only).

    python benchmarks/attained_service.py                     # ChatGPT val, chatgpt/pairwise
    python benchmarks/attained_service.py --predictor recorded/pairwise --out /tmp/as.json

Writes --out (default metrics/choices/attained_service-<model>.json).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.contracts import generations_path, prompts_path, write_json  # noqa: E402

GENERATED = (0, 25, 50, 100, 200, 400, 800)  # tokens already generated
DECILES = 10
MIN_LEFT = 10  # a cell's mean needs this many requests still running


def _spans(deciles: set[int]) -> str:
    """{1, 2, 3, 5} -> '1-3, 5'."""
    out, run = [], []
    for d in sorted(deciles):
        if run and d != run[-1] + 1:
            out.append(run)
            run = []
        run.append(d)
    out.extend([run] if run else [])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out) or "none"


def mean_remaining(lengths: np.ndarray, scores: np.ndarray) -> dict[str, dict[str, float | None]]:
    """{decile: {g: E[L - g | L > g]}} over the requests of each score decile ("1" = lowest scores);
    None where fewer than MIN_LEFT requests are still running at g."""
    decile = np.minimum((np.argsort(np.argsort(scores, kind="stable")) * DECILES) // len(scores), DECILES - 1)
    table = {}
    for d in range(DECILES):
        row = {}
        for g in GENERATED:
            left = lengths[(decile == d) & (lengths > g)]
            row[str(g)] = float((left - g).mean()) if left.size >= MIN_LEFT else None
        table[str(d + 1)] = row
    return table


def judge(table: dict[str, dict[str, float | None]]) -> tuple[list[int], list[int]]:
    """(deciles whose mean remaining answer grows somewhere with g, deciles in which a running request
    comes to expect at least what the next decile up expects at its start). In a burst served in
    score order the requests waiting while decile d runs are of decile d + 1 and up: only the second
    kind makes preempting on expected remaining answer pay."""
    rising, overtaken = [], []
    for d in range(1, DECILES + 1):
        known = [v for v in table[str(d)].values() if v is not None]
        if any(b > a for a, b in zip(known, known[1:])):
            rising.append(d)
        if d < DECILES and max(known) >= table[str(d + 1)]["0"]:
            overtaken.append(d)
    return rising, overtaken


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="chatgpt", help="eval model whose val answers are measured")
    ap.add_argument(
        "--predictor", default="chatgpt/pairwise", help="<train model>/<method> under models/, or a checkpoint dir"
    )
    ap.add_argument("--out", default=None, help="default metrics/choices/attained_service-<model>.json")
    args = ap.parse_args(argv)

    from pipeline.serving.scorer import Scorer

    ckpt = Path(args.predictor) if Path(args.predictor, "pars.json").is_file() else Path("models") / args.predictor
    for path in (prompts_path(), generations_path(args.model), ckpt / "pars.json"):
        if not path.is_file():
            sys.exit(f"attained_service: {path} not found (run `dvc repro`, or check --model / --predictor)")
    prompts = pd.read_parquet(prompts_path()).drop_duplicates("prompt_id").set_index("prompt_id")
    gens = pd.read_parquet(generations_path(args.model))
    gens = gens[gens.prompt_id.isin(prompts.index[prompts.split == "val"]) & (gens.output_tokens > 0)]
    # one answer per prompt (ChatGPT has one); the mean over a prompt's samples would hide their spread
    req = gens.groupby("prompt_id", sort=True).sample(n=1, random_state=np.random.default_rng(0))
    lengths = req.output_tokens.to_numpy(np.int64)
    print(f"attained_service: {len(req)} val prompts of {args.model}; scoring with {args.predictor}", flush=True)
    scores = Scorer.from_pretrained(ckpt).score(prompts.loc[req.prompt_id, "prompt"].tolist(), progress=True)
    table = mean_remaining(lengths, scores)
    rising, overtaken = judge(table)
    print(f"\n{'score decile':<13}" + "".join(f"{'g=' + str(g):>8}" for g in GENERATED))
    for d, row in table.items():
        print(f"{d:<13}" + "".join(f"{'-' if v is None else round(v):>8}" for v in row.values()))
    finding = (
        (
            f"the mean remaining answer falls as a request runs in deciles {_spans(set(range(1, DECILES + 1)) - set(rising))}"
            + (f" and grows in {_spans(set(rising))}" if rising else "")
            + "; in no decile does a running request come to expect more than the next decile up expects at its "
            "start. In a burst served in score order a shortest-expected-remaining-first scheduler would therefore "
            "not preempt: attained service, as expected remaining answer, cannot close the burst's gap to oracle SJF, which is the ranking's"
        )
        if not overtaken
        else f"in deciles {_spans(set(overtaken))} a running request comes to expect more than the next decile up "
        "expects at its start: preempting it on attained service could pay (simulate it before adopting it)"
    )
    print(f"\n{finding}")
    out = write_json(
        {
            "question": "Could attained service (tokens already generated) close the gap to oracle SJF without a better ranking?",
            "eval_model": args.model,
            "split": "val",
            "predictor": args.predictor,
            "n_prompts": int(len(req)),
            "command": "python benchmarks/attained_service.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "what": "mean remaining answer tokens E[L - g | L > g] by the predictor's score decile (1 = shortest "
            f"predicted) after g generated tokens; null where fewer than {MIN_LEFT} requests are still running",
            "mean_remaining_tokens": table,
            "deciles_where_it_grows_with_g": rising,
            "deciles_overtaking_the_next_decile_start": overtaken,
            "finding": finding,
        },
        args.out or f"metrics/choices/attained_service-{args.model}.json",
    )
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_script

    raise SystemExit(run_script(main))
