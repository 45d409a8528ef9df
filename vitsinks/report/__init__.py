"""The leaderboard's library (`python -m vitsinks.leaderboard` is its command): `collect` the runs' results, `render`
the tables and the `figure`, keep the `leaderboard_inputs`, write them all (`writer.build`)."""

from vitsinks.report.collect import aggregate, collect, columns, run_dirs, variant_order
from vitsinks.report.figure import figure
from vitsinks.report.render import significant_best, to_html, to_markdown
from vitsinks.report.writer import build

__all__ = ["aggregate", "build", "collect", "columns", "figure", "run_dirs", "significant_best", "to_html",
           "to_markdown", "variant_order"]
