"""A leaderboard's inputs: the files of every run it read, copied beside its tables into `<out>/inputs/<run>/`,
with its title. `python -m vitsinks.leaderboard runs=<out>/inputs out=<out>` writes the same leaderboard again from
them alone (no checkpoint, no data): how a committed leaderboard is regenerated with today's code, and how
`tests/test_committed.py` finds the committed ones that are stale.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from vitsinks.utils import files
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import LEADERBOARD_FILES, LEADERBOARD_INPUTS, RunDir

INPUTS, LEADERBOARD = LEADERBOARD_INPUTS, LEADERBOARD_FILES  # the folder beside the tables; the generation's kind
RECORD = "leaderboard.json"  # in it: how the leaderboard was asked for (its title)
RUNS_DIR = "<runs_dir>"  # what the copies say instead of the machine path of the runs' folder (never tabulated)
TEXT = (".yaml", ".json", ".jsonl")


def run_inputs(run: RunDir) -> list[Path]:
    """The files of `run` the leaderboard reads (the one diagnostics summary and interventions report it picks)."""
    found = [run.config, run.metrics, *sorted(run.results.glob("*.json")), run.latest_summary(),
             run.latest_interventions()]
    return [p for p in found if p is not None and p.is_file()]


def check_names(runs: list[RunDir], out: Path) -> None:
    """`BadValue` when two runs share a name: their inputs could not sit side by side in `<out>/inputs/`."""
    names = [r.name for r in runs]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise BadValue(f"several runs are named {', '.join(twice)}: their inputs cannot sit side by side in "
                       f"{out / INPUTS}; tabulate them separately")


def record(runs: list[RunDir], out: Path, title: str, unfinished: Sequence[str] = ()) -> Path:
    """Copy every run's inputs (the runs' folder written `RUNS_DIR`) into `<out>/inputs/<run name>/`, with the
    title and the `unfinished` footnotes in `inputs/leaderboard.json`. Returns the folder."""
    check_names(runs, out)
    tmp = out / INPUTS
    for run in runs:
        for path in run_inputs(run):
            target = tmp / run.name / path.relative_to(run.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix in TEXT:  # configs and results name checkpoints by absolute path: keep no machine path
                text = path.read_text()
                for folder in {str(run.path.parent.absolute()), str(run.path.parent.resolve())}:
                    text = text.replace(folder, RUNS_DIR)
                target.write_text(text)
            else:
                shutil.copy2(path, target)
    files.write_json(tmp / RECORD, {"title": title, **({"unfinished": list(unfinished)} if unfinished else {})})
    return tmp


def recorded_title(source: str | Path) -> str | None:
    """The title recorded in a leaderboard's inputs folder `source`, or None (not such a folder)."""
    path = Path(source) / RECORD
    if not path.is_file():
        return None
    fix = f"rerun `python -m vitsinks.leaderboard runs=<the runs> out={Path(source).parent}`"
    return str(files.read_json(path, fix).get("title") or "vitsinks leaderboard")


def recorded_unfinished(source: str | Path) -> list[str]:
    """The footnotes on unfinished runs recorded in a leaderboard's inputs folder `source` (none: empty)."""
    path = Path(source) / RECORD
    fix = f"rerun `python -m vitsinks.leaderboard runs=<the runs> out={Path(source).parent}`"
    return [str(n) for n in files.read_json(path, fix).get("unfinished", [])] if path.is_file() else []
