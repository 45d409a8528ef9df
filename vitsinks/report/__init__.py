"""The leaderboard's library: collect every run's registered results (`collect`), render the tables (`render`)
and the figure (`figure`), keep what it read (`inputs`). `python -m vitsinks.leaderboard` is the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitsinks.report.collect import aggregate, collect, columns, run_dirs, variant_order
from vitsinks.report.figure import figure
from vitsinks.report.inputs import check_names, record, recorded_title
from vitsinks.report.render import significant_best, to_html, to_markdown, write_runs_csv, write_table_csv
from vitsinks.utils import files

__all__ = ["aggregate", "build", "collect", "columns", "figure", "run_dirs", "significant_best", "to_html",
           "to_markdown", "variant_order"]


def build(source: str | Path, out: str | Path, title: str | None = None) -> list[dict[str, Any]]:
    """Collect, aggregate and write leaderboard.{md,csv,html,png}, runs.csv and the inputs (`inputs.record`);
    returns the aggregated table. `title` defaults to the one recorded with the inputs when `source` is a
    leaderboard's inputs folder, else "vitsinks leaderboard". Runs are taken by name (the same files, the same
    output, whatever order a sweep listed them in)."""
    title = title or recorded_title(source) or "vitsinks leaderboard"
    runs = sorted(run_dirs(source), key=lambda r: r.name)
    out = Path(out)
    check_names(runs, out)  # before any table is written: a refused leaderboard leaves the old one whole
    rows = [collect(r) for r in runs]
    table = aggregate(rows)
    out.mkdir(parents=True, exist_ok=True)
    files.write_text(out / "leaderboard.md", f"# {title}\n\n" + to_markdown(table))
    write_table_csv(table, out / "leaderboard.csv")
    write_runs_csv(rows, out / "runs.csv")
    files.write_text(out / "leaderboard.html", to_html(table, title))
    figure(table, out / "leaderboard.png")
    record(runs, out, title)
    return table
