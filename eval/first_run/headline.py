"""The first run's numbers as the docs quote them, from the runs eval/first_run/make_first_run.sh banked.

    python eval/first_run/headline.py [BOARD]      # BOARD: eval/first_run (its inputs/ and bench.txt)

Prints the per-seed table of docs/training.md#the-first-run and the README's one-line headline;
tests/test_first_run.py fails while the docs say anything else.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

BOARD = Path(__file__).resolve().parent
COLUMNS = {"online": "online probe top-1 (%)", "linear": "linear probe top-1 (%)", "miou": "synthetic mIoU",
           "sinks": "sink events / image", "loss": "loss, step 10 -> last"}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SystemExit(f"error: cannot read {path} ({err}); rerun bash eval/first_run/make_first_run.sh") from None


def seed_rows(board: Path = BOARD) -> dict[int, dict[str, Any]]:
    """seed -> its numbers, from each banked run (config, metrics, results, last diagnosis)."""
    rows = {}
    for run in sorted((board / "inputs").glob("*-s[0-9]*")):
        metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        losses = [m for m in metrics if "loss" in m]
        online = [m["val/probe_acc"] for m in metrics if "val/probe_acc" in m]
        seed = int(re.search(r"^seed: (\d+)$", (run / "config.yaml").read_text(), re.M).group(1))
        summary = _json(next((run / "diagnostics").glob("*/summary.json")))
        rows[seed] = {"online": 100 * online[-1], "linear": _json(run / "results" / "linear.json")["best"]["top1"],
                      "miou": 100 * _json(run / "results" / "dense_synthetic.json")["mIoU"],
                      "sinks": summary["sinks_per_image"]["all"]["all"],
                      "loss": (losses[0]["loss"], losses[-1]["loss"])}
    if len(rows) < 3:
        raise SystemExit(f"error: {board / 'inputs'} holds {len(rows)} seeds, the docs quote 3; rerun "
                         f"bash eval/first_run/make_first_run.sh")
    return dict(sorted(rows.items()))


def spread(values: list[float]) -> str:
    """'mean ± sd (min-max)', sample standard deviation."""
    return (f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f} "
            f"({min(values):.1f}-{max(values):.1f})")


def table(rows: dict[int, dict[str, Any]]) -> str:
    """The per-seed Markdown table with a mean ± sd (range) row."""
    lines = ["| seed | " + " | ".join(COLUMNS.values()) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for seed, r in rows.items():
        lines.append(f"| {seed} | {r['online']:.1f} | {r['linear']:.1f} | {r['miou']:.1f} | {r['sinks']:.2f} | "
                     f"{r['loss'][0]:.3f} -> {r['loss'][1]:.3f} |")
    cols = ("online", "linear", "miou")
    lines.append("| mean ± sd (range) | " + " | ".join(spread([r[k] for r in rows.values()]) for k in cols)
                 + f" | {max(r['sinks'] for r in rows.values()):.2f} (max) | |")
    return "\n".join(lines)


def headline(rows: dict[int, dict[str, Any]]) -> str:
    """The README's sentence of the first run's numbers."""
    seeds = list(rows)
    sinks = max(r["sinks"] for r in rows.values())
    return (f"online probe top-1 {spread([r['online'] for r in rows.values()])} and linear probe top-1 "
            f"{spread([r['linear'] for r in rows.values()])} (%, chance 10), synthetic mIoU "
            f"{spread([r['miou'] for r in rows.values()])}, over seeds {seeds[0]}-{seeds[-1]} (mean ± sd (range)); "
            + ("no sink event" if sinks == 0 else f"at most {sinks:.2f} sink events per image"))


def bench_line(board: Path = BOARD) -> str:
    """The benchmark's first line (the command, its wall and CPU time, the machine's load)."""
    return (board / "bench.txt").read_text().splitlines()[0]


def main(argv: list[str]) -> int:
    board = Path(argv[0]) if argv else BOARD
    rows = seed_rows(board)
    print(table(rows), headline(rows), bench_line(board), sep="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
