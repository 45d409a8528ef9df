"""The per-run numbers that docs/studies.md quotes for a residual study, written from a leaderboard's committed inputs
(no model is run): per trained run, its high-norm tokens and top activation at the first and last block, the
training-free edits' and W8A8's change of its probes, and per variant the seed range those changes are judged against.

    python eval/residual/findings.py eval/residual/fashion_mnist      # writes eval/residual/fashion_mnist/findings.md

The leaderboard gives each variant's mean and spread; this gives the runs one by one, for claims about single seeds.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
INPUTS = "inputs"  # vitsinks.report.inputs.INPUTS (not imported, so that the script runs without the package)


def _num(text: str) -> float:
    return float(text) if text not in ("", "nan") else math.nan


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def _delta(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:+.2f}"


def _summary(board: Path, run: str) -> dict:
    found = sorted((board / INPUTS / run / "diagnostics").glob("*/summary.json"))
    if not found:
        raise SystemExit(f"{board / INPUTS / run}: no diagnostics summary; rerun the study's make script")
    return json.loads(found[-1].read_text())


def _sources(board: Path) -> dict[str, tuple[str, str]]:
    """Each derived run's (trained run, method), from its config's trainfree.source and trainfree.method."""
    out = {}
    for config in sorted((board / INPUTS).glob("*/config.yaml")):
        tf = (yaml.safe_load(config.read_text()) or {}).get("trainfree") or {}
        if tf.get("source") and tf.get("method"):
            out[config.parent.name] = (Path(tf["source"]).parents[1].name, tf["method"])
    return out


def _shown(board: Path) -> str:
    """`board` as the page names it: relative to the repository when in it (the same page from anywhere)."""
    try:
        return board.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return board.as_posix()


def findings(board: Path) -> str:
    """The findings page (markdown) of the leaderboard folder `board`."""
    rows = {r["run"]: r for r in csv.DictReader((board / "runs.csv").open())}
    sources = _sources(board)
    # the leaderboard's order of variants, seed-major
    order = [r["variant"] for r in csv.DictReader((board / "leaderboard.csv").open())]
    trained = sorted((r for r in rows if r not in sources), key=lambda r: (int(rows[r]["seed"]),
                                                                             order.index(rows[r]["variant"])))
    dense = next((c for c in next(iter(rows.values())) if c.startswith("dense_")
                  and any(not math.isnan(_num(r[c])) for r in rows.values())), None)
    edits: dict[str, dict[str, dict]] = defaultdict(dict)
    for derived, (parent, method) in sources.items():
        edits[parent][method] = rows[derived]
    methods = sorted({m for _, m in sources.values()})

    lines = [f"# Per-run findings: {_shown(board)}", "",
             f"Written by `python eval/residual/findings.py {_shown(board)}` from the leaderboard's inputs. "
             "Blocks are counted from 0; a token's norm is compared with the median norm of its image at that block. "
             "A missing training-free row (-) is an edit the run refused or was not given.", "",
             "## Residual side", "",
             "| run | tokens > 2x / image, first block | > 2x, last block | most > 5x / image (block) | "
             "most > 10x / image | patches > 5x, last block | max / median norm, first -> last | "
             "top act. / median, first -> last |", "|---" * 8 + "|"]
    for run in trained:
        s = _summary(board, run)
        hn = s["residual"]["high_norm"]
        k2, k5, k10 = (hn[k]["per_image_by_block"] for k in ("2.0", "5.0", "10.0"))
        b5 = max(range(len(k5)), key=k5.__getitem__)
        ratio = s["massive_activations"]["ratio_by_block"]
        top = s["residual"]["top_activations"]["ratio_by_block"]
        lines.append(f"| {run} | {k2[0]:.2f} | {k2[-1]:.2f} | {k5[b5]:.2f} ({b5}) | {max(k10):.2f} | "
                     f"{hn['5.0']['location_by_block']['patch'][-1]:.2f} | {ratio[0]:.2f} -> {ratio[-1]:.2f} | "
                     f"{top[0]:.1f} -> {top[-1]:.1f} |")

    head = ["run", "linear top-1", "mIoU"] + [f"{m}: linear / mIoU change" for m in methods] + \
        ["W8A8 1 - cos", "W8A8 linear / online / mIoU change"]
    lines += ["", "## Probes under the training-free edits and W8A8", "", f"mIoU: `{dense}`.", "",
              "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for run in trained:
        r = rows[run]
        cells = [run, _fmt(_num(r["linear_top1"])), _fmt(_num(r[dense]))]
        for m in methods:
            e = edits[run].get(m)
            cells.append("-" if e is None else f"{_delta(_num(e['linear_top1']) - _num(r['linear_top1']))} / "
                         f"{_delta(_num(e[dense]) - _num(r[dense]))}")
        cells += [f"{_num(r['w8a8_cos_err']):.1e}", " / ".join(_delta(_num(r[c])) for c in
                                                                ("w8a8_d_linear", "w8a8_d_online", "w8a8_d_dense"))]
        lines.append("| " + " | ".join(cells) + " |")

    lines += ["", "## Seed range per variant (max - min over its seeds)", "",
              "| variant | seeds | linear top-1 | online top-1 | mIoU | W8A8 1 - cos |", "|---" * 6 + "|"]
    by_variant: dict[str, list[dict]] = defaultdict(list)
    for run in trained:
        by_variant[rows[run]["variant"]].append(rows[run])
    for variant, rs in sorted(by_variant.items(), key=lambda item: order.index(item[0])):
        spans = [max(v) - min(v) for v in ([_num(r[c]) for r in rs] for c in
                                          ("linear_top1", "online_top1", dense, "w8a8_cos_err"))]
        lines.append(f"| {variant} | {len(rs)} | " + " | ".join(
            ("-" if len(rs) < 2 else f"{x:.2f}" if i < 3 else f"{x:.1e}") for i, x in enumerate(spans)) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not all((Path(argv[0]) / f).is_file() for f in ("runs.csv", "leaderboard.csv")):
        print("usage: python eval/residual/findings.py BOARD (a leaderboard folder with runs.csv, leaderboard.csv and "
              "inputs/)", file=sys.stderr)
        return 2
    board = Path(argv[0])
    (board / "findings.md").write_text(findings(board))
    print(f"written: {board / 'findings.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
