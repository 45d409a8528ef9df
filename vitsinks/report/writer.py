"""The leaderboard written into a folder (`build`): its tables, figure and inputs, one generation of files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitsinks.report.collect import aggregate, collect, run_dirs
from vitsinks.report.figure import figure
from vitsinks.report.leaderboard_inputs import LEADERBOARD, check_names, record, recorded_title, recorded_unfinished
from vitsinks.report.render import to_html, to_markdown, write_runs_csv, write_table_csv
from vitsinks.report.unfinished import split
from vitsinks.utils import files
from vitsinks.utils.errors import InputNotFound
from vitsinks.utils.generations import claim, generation


def build(source: str | Path, out: str | Path, title: str | None = None) -> list[dict[str, Any]]:
    """Collect, aggregate and write leaderboard.{md,csv,html,png}, runs.csv and the inputs, as one generation
    (an earlier leaderboard's replaced, a non-empty `out` without one refused); returns the aggregated table."""
    title = title or recorded_title(source) or "vitsinks leaderboard"
    runs = sorted(run_dirs(source), key=lambda r: r.name)
    # derived runs that did not finish: left out, each named in a footnote with the command that finishes it
    runs, notes = (runs, recorded_unfinished(source)) if recorded_title(source) is not None else split(runs)
    if not runs:
        raise InputNotFound(f"no finished run to tabulate in {source}: {' '.join(notes)}")
    out = Path(out)
    claim(out, LEADERBOARD)
    check_names(runs, out)  # before any table is written: a refused leaderboard leaves the old one whole
    rows = [collect(r) for r in runs]
    table = aggregate(rows)
    with generation(out, LEADERBOARD) as stage:
        files.write_text(stage / "leaderboard.md", f"# {title}\n\n" + to_markdown(table, notes))
        write_table_csv(table, stage / "leaderboard.csv")
        write_runs_csv(rows, stage / "runs.csv")
        files.write_text(stage / "leaderboard.html", to_html(table, title, notes))
        figure(table, stage / "leaderboard.png")
        record(runs, stage, title, notes)
    for note in notes:
        print(note, flush=True)
    return table
