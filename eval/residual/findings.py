"""The per-run numbers that docs/studies.md quotes for a residual study, written from a leaderboard's committed inputs
(no model is run): per trained run, its high-norm tokens and top activation at the first and last block, the
training-free edits' and W8A8's change of its probes, and per variant the seed range those changes are judged against.

    python eval/residual/findings.py eval/residual/fashion_mnist      # writes eval/residual/fashion_mnist/findings.md
    python eval/residual/findings.py BOARD OUT                        # reads OUT's tables (BOARD written again there)

The leaderboard gives each variant's mean and spread; this gives the runs one by one, for claims about single seeds.
`bash eval/regenerate.sh` writes it again beside the leaderboard; tests/test_findings_script.py fails while it is stale.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from vitsinks.posthoc import mitigations
from vitsinks.probes.probe_results import run_probe_seeds
from vitsinks.report.leaderboard_inputs import INPUTS, RECORD
from vitsinks.utils import files
from vitsinks.utils.errors import InputNotFound, UserError
from vitsinks.utils.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
PAGE = "findings.md"
MIXED = "probe seeds differ"  # a change between probes of two seeds is a seed's, not the edit's: not shown
UNKNOWN = "probe seed unknown"  # one of the two probes records its seed, the other does not
NO_PROBE, NO_SOURCE_PROBE = "no probe", "source not probed"  # the edited run (its source) has no such probe result
NO_RESIDUAL = ("-: the summary has no residual measures (diagnosed with diagnostics.residual=false, or written before "
               "they were measured); rediagnose the run to have them")


def _num(text: str) -> float:
    return float(text) if text not in ("", "nan") else math.nan


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def _delta(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:+.2f}"


def _rewrite(board: Path, path: Path) -> str:
    """The fix for a torn or foreign file of `board`'s inputs or tables: the commands that write it again."""
    return (f"restore it (`git checkout -- {path}` for a committed board) or write the board again from its runs "
            f"(`python -m vitsinks.leaderboard runs=<the runs> out={board}`)")


def _summary(board: Path, run: str) -> dict:
    found = sorted((board / INPUTS / run / "diagnostics").glob("*/summary.json"))
    if not found:
        raise InputNotFound(f"{board / INPUTS / run}: no diagnostics summary; rerun the study's make script")
    return files.read_json(found[-1], _rewrite(board, found[-1]))


def _table(tables: Path, name: str, board: Path, needs: bool = True) -> list[dict[str, str]]:
    """The rows of `tables`/`name` (runs.csv, leaderboard.csv); a torn one (with `needs`: one without the columns
    read here) is a `BadFile` with the command that writes it again."""
    fix = f"rerun `python -m vitsinks.leaderboard runs={board / INPUTS} out={tables}`"
    columns = ("run", "variant", "seed") if name == "runs.csv" else ("variant",)
    return files.read_csv(tables / name, fix, needs=columns if needs else ())


def _sources(board: Path) -> dict[str, tuple[str, str]]:
    """Each derived run's (trained run, method), from its config's trainfree.source and trainfree.method."""
    out = {}
    for config in sorted((board / INPUTS).glob("*/config.yaml")):
        try:
            tf = (yaml.safe_load(config.read_text()) or {}).get("trainfree") or {}
        except yaml.YAMLError as err:
            raise files.BadFile(f"{config} is torn or is not a run's config ({' '.join(str(err).split())}): "
                                f"{_rewrite(board, config)} to write it again") from err
        if tf.get("source") and tf.get("method"):
            out[config.parent.name] = (Path(tf["source"]).parents[1].name, tf["method"])
    return out


def _probe_seeds(board: Path, run: str, kinds: list[str]) -> dict[str, int | None]:
    """The seed of each of `run`'s probe results of these kinds (linear, dense_*), as the leaderboard reads them
    (`run_probe_seeds`: a result that records none takes the one its run's other probes record); a kind without a
    result file takes that one seed too."""
    seeds = run_probe_seeds(RunDir(board / INPUTS / run))
    known = {s for s in seeds.values() if s is not None}
    return {k: seeds.get(k, next(iter(known)) if len(known) == 1 else None) for k in kinds}


def _change(new: float, old: float, seeds: tuple[int | None, int | None]) -> str:
    """`new - old` (the edited run's probe minus its source's), or why it is not shown: one of the two has no such
    probe, the two probes' seeds differ, or one records its seed and one does not."""
    if math.isnan(new):
        return NO_PROBE
    if math.isnan(old):
        return NO_SOURCE_PROBE
    if None not in seeds and seeds[0] != seeds[1]:
        return MIXED
    if seeds.count(None) == 1:
        return UNKNOWN
    return _delta(new - old)


def _span(values: list[float], spec: str) -> str:
    """max - min of the values that exist; `(n)` after it when only n of the seeds have one; - under two."""
    have = [v for v in values if not math.isnan(v)]
    if len(have) < 2:
        return "-"
    return f"{max(have) - min(have):{spec}}" + ("" if len(have) == len(values) else f" ({len(have)})")


def _shown(board: Path) -> str:
    """`board` as the page names it: relative to the repository when in it (the same page from anywhere)."""
    try:
        return board.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return board.as_posix()


def _residual_cells(s: dict) -> tuple[list[str], bool]:
    """A trained run's cells of the residual table from its summary `s`, `-` where the summary lacks the measure;
    and whether it lacked one (a summary written with diagnostics.residual=false has no `residual`)."""
    residual = s.get("residual") or {}
    hn = residual.get("high_norm") or {}
    k2, k5, k10 = ((hn.get(k) or {}).get("per_image_by_block") for k in ("2.0", "5.0", "10.0"))
    patches = ((hn.get("5.0") or {}).get("location_by_block") or {}).get("patch")
    ratio = (s.get("massive_activations") or {}).get("ratio_by_block")
    top = (residual.get("top_activations") or {}).get("ratio_by_block")
    most5 = "-"
    if k5:
        b5 = max(range(len(k5)), key=k5.__getitem__)
        most5 = f"{k5[b5]:.2f}" + (f" ({b5})" if k5[b5] > 0 else "")  # no block is named when there is none
    cells = [f"{k2[0]:.2f}" if k2 else "-", f"{k2[-1]:.2f}" if k2 else "-", most5, f"{max(k10):.2f}" if k10 else "-",
             f"{patches[-1]:.2f}" if patches else "-", f"{ratio[0]:.2f} -> {ratio[-1]:.2f}" if ratio else "-",
             f"{top[0]:.1f} -> {top[-1]:.1f}" if top else "-"]
    return cells, not (k2 and k5 and k10 and patches and ratio and top)


def findings(board: Path, tables: Path | None = None) -> str:
    """The findings page (markdown) of the leaderboard folder `board`: its tables (runs.csv, leaderboard.csv) read
    from `tables` (default `board`), the diagnostics summaries, configs and probe results from `board`'s inputs."""
    tables = tables or board
    rows = {r["run"]: r for r in _table(tables, "runs.csv", board)}
    sources = _sources(board)
    order = [r["variant"] for r in _table(tables, "leaderboard.csv", board)]

    def place(variant: str) -> int:  # a variant's first row on the leaderboard (rows split by setting: `<v> (...)`)
        return next((i for i, v in enumerate(order) if v == variant or v.startswith(f"{variant} (")), len(order))

    # seed-major, the leaderboard's order of variants within a seed
    trained = sorted((r for r in rows if r not in sources), key=lambda r: (int(rows[r]["seed"]),
                                                                             place(rows[r]["variant"])))
    dense = next((c for c in sorted(next(iter(rows.values()))) if c.startswith("dense_")
                  and any(not math.isnan(_num(r[c])) for r in rows.values())), None)
    kinds = ["linear"] + ([dense] if dense else [])
    edits: dict[str, dict[str, str]] = defaultdict(dict)
    for derived, (parent, method) in sources.items():
        edits[parent][method] = derived
    present = {m for _, m in sources.values()}
    methods = [m for m in mitigations() if m in present] + sorted(present - set(mitigations()))

    def miou(r: dict) -> float:
        return _num(r[dense]) if dense else math.nan

    lines = [f"# Per-run findings: {_shown(board)}", "",
             f"Written by `python eval/residual/findings.py {_shown(board)}` from the leaderboard's inputs. "
             "Blocks are counted from 0; a token's norm is compared with the median norm of its image at that block. "
             "A missing training-free row (-) is an edit the run refused or was not given; "
             f"\"{MIXED}\" (\"{UNKNOWN}\"): the edited run's probe and its source's were made with two seeds (one "
             "records its seed, the other does not), so the change is not shown; a result that records no seed takes "
             "the one its run's other probe records (vitsinks probes a run with one seed).",
             "", "## Residual side", "",
             "| run | tokens > 2x / image, first block | > 2x, last block | most > 5x / image (block) | "
             "most > 10x / image | patches > 5x, last block | max / median norm, first -> last | "
             "top act. / median, first -> last |", "|---" * 8 + "|"]
    without = False  # a summary without residual measures (or without one of the levels)
    for run in trained:
        cells, missing = _residual_cells(_summary(board, run))
        without |= missing
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    lines += ["", NO_RESIDUAL] if without else []

    head = ["run", "linear top-1", "mIoU"] + [f"{m}: linear / mIoU change" for m in methods] + \
        ["W8A8 1 - cos", "W8A8 linear / online / mIoU change"]
    lines += ["", "## Probes under the training-free edits and W8A8", "", f"mIoU: `{dense or 'none'}`.", "",
              "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    unprobed = False
    for run in trained:
        r = rows[run]
        cells = [run, _fmt(_num(r.get("linear_top1", ""))), _fmt(miou(r))]
        for m in methods:
            derived = edits[run].get(m)
            if derived is None:
                cells.append("-")
            else:
                e, ours, theirs = rows[derived], _probe_seeds(board, run, kinds), _probe_seeds(board, derived, kinds)
                cells.append(" / ".join([
                    _change(_num(e.get("linear_top1", "")), _num(r.get("linear_top1", "")),
                            (ours["linear"], theirs["linear"])),
                    _change(miou(e), miou(r), (ours[dense], theirs[dense])) if dense else "-"]))
        err = _num(r.get("w8a8_cos_err", ""))
        cells += ["-" if math.isnan(err) else f"{err:.1e}",
                  " / ".join(_delta(_num(r.get(c, ""))) for c in ("w8a8_d_linear", "w8a8_d_online", f"w8a8_d_{dense}"))]
        lines.append("| " + " | ".join(cells) + " |")
        unprobed |= any(NO_PROBE in c or NO_SOURCE_PROBE in c for c in cells)
    if unprobed:
        lines += ["", f"\"{NO_PROBE}\" (\"{NO_SOURCE_PROBE}\"): the edited run (its source run) has no such probe "
                  "result, so there is no change to show; probe it (python -m vitsinks.eval.linear / eval.dense)."]

    lines += ["", "## Seed range per variant (max - min over its seeds)", "",
              "(n): over the n seeds that have the value; -: fewer than two.", "",
              "| variant | seeds | linear top-1 | online top-1 | mIoU | W8A8 1 - cos |", "|---" * 6 + "|"]
    by_variant: dict[str, list[dict]] = defaultdict(list)
    for run in trained:
        by_variant[rows[run]["variant"]].append(rows[run])
    for variant, rs in sorted(by_variant.items(), key=lambda item: place(item[0])):
        spans = [_span([_num(r.get(c, "")) for r in rs], ".2f") for c in ("linear_top1", "online_top1")] + \
            [_span([miou(r) for r in rs], ".2f"), _span([_num(r.get("w8a8_cos_err", "")) for r in rs], ".1e")]
        lines.append(f"| {variant} | {len(rs)} | " + " | ".join(spans) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Write `BOARD`'s findings.md (beside OUT's tables); a bad input is one line, `error: <what and the fix>`, and
    exit code 1 (2: a wrong call)."""
    try:
        return _main(argv)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python eval/residual/findings.py BOARD [OUT] (BOARD: a leaderboard folder with inputs/; its "
              "runs.csv and leaderboard.csv read from OUT when given, where findings.md is written)", file=sys.stderr)
        return 2
    board, tables = Path(argv[0]), Path(argv[-1])
    if not (board / INPUTS / RECORD).is_file():
        print(f"{board} is not a leaderboard folder with inputs (no {INPUTS}/{RECORD}): give the folder of a "
              f"leaderboard.md that python -m vitsinks.leaderboard wrote", file=sys.stderr)
        return 2
    rows = {r.get("run") for r in _table(tables, "runs.csv", board, needs=False)} - {None} \
        if all((tables / f).is_file() for f in ("runs.csv", "leaderboard.csv")) else set()
    missing = sorted(set(_sources(board)) - rows)
    if not rows or missing:
        print(f"{tables}'s tables lack {'its runs' if not rows else missing[0]}: write them from {board / INPUTS} "
              f"first (python -m vitsinks.leaderboard runs={board / INPUTS} out={tables})", file=sys.stderr)
        return 2
    (tables / PAGE).write_text(findings(board, tables))
    print(f"written: {tables / PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
