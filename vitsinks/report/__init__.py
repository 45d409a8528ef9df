"""The leaderboard's library: collect every run's registered results (`collect`), render the tables (`render`)
and the figure (`figure`), keep what it read (`inputs`), write them all (`writer.build`).
`python -m vitsinks.leaderboard` is the command line."""

from vitsinks.report.collect import aggregate, collect, columns, run_dirs, variant_order
from vitsinks.report.figure import figure
from vitsinks.report.render import significant_best, to_html, to_markdown
from vitsinks.report.writer import build

__all__ = ["aggregate", "build", "collect", "columns", "figure", "run_dirs", "significant_best", "to_html",
           "to_markdown", "variant_order"]
