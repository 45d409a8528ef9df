"""The leaderboard's library: collect every run's registered results (`collect`), render the tables (`render`)
and the figure (`figure`). `python -m vitsinks.leaderboard` is the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitsinks.report.collect import aggregate, collect, columns, run_dirs, variant_order
from vitsinks.report.figure import figure
from vitsinks.report.render import significant_best, to_html, to_markdown, write_runs_csv, write_table_csv
from vitsinks.utils import files

__all__ = ["aggregate", "build", "collect", "columns", "figure", "run_dirs", "significant_best", "to_html",
           "to_markdown", "variant_order"]


def build(source: str | Path, out: str | Path, title: str = "vitsinks leaderboard") -> list[dict[str, Any]]:
    """Collect, aggregate and write leaderboard.{md,csv,html,png} and runs.csv; returns the aggregated table."""
    rows = [collect(r) for r in run_dirs(source)]
    table = aggregate(rows)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files.write_text(out / "leaderboard.md", f"# {title}\n\n" + to_markdown(table))
    write_table_csv(table, out / "leaderboard.csv")
    write_runs_csv(rows, out / "runs.csv")
    files.write_text(out / "leaderboard.html", to_html(table, title))
    figure(table, out / "leaderboard.png")
    return table
