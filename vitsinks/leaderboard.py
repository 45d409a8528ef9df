"""The leaderboard: every variant's quality and mechanism side by side.

    python -m vitsinks.leaderboard runs=runs/sweeps/sweep-<id>      # a sweep folder or its sweep.json
    python -m vitsinks.leaderboard runs=runs [out=eval/leaderboard]  # every run directory under a folder
    python -m vitsinks.leaderboard runs=eval/leaderboard/inputs      # again, from its inputs, with today's code

One row per experiment (runs that differ only in the seed) as mean +- std over seeds: the probes and the diagnostics
summary; a variant is marked where Welch's t-test says it beats every other. Writes leaderboard.{md,csv,html,png},
runs.csv and `inputs/` (the files it read: enough to write it again) into `out` (docs/report.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vitsinks.configs.cli import parse_args, run_command
from vitsinks.report import build, to_markdown
from vitsinks.report.leaderboard_inputs import recorded_title
from vitsinks.utils.errors import BadValue, ConfigError
from vitsinks.utils.registry import import_plugins
from vitsinks.utils.rundir import leaderboard_dir


@dataclass
class LeaderboardArgs:
    runs: str | None = None  # a folder of run directories, or a sweep folder / sweep.json
    out: str | None = None  # default: <runs>/leaderboard (next to sweep.json for a manifest; for inputs: their board)
    title: str | None = None  # default: the title recorded in runs=<leaderboard>/inputs, else "vitsinks leaderboard"
    plugins: list[str] = field(default_factory=list)  # modules to import first: your own probe protocols, data sets


USAGE = "python -m vitsinks.leaderboard runs=<folder or sweep> [out=<folder>] [title=...] [plugins=[...]]"


def leaderboard_command(argv: Sequence[str]) -> int:
    args = parse_args(argv, LeaderboardArgs, USAGE)
    import_plugins(args.plugins)
    if not args.runs:
        raise ConfigError(f"no runs given; usage: {USAGE}")
    src = Path(args.runs)
    # a leaderboard's inputs: the leaderboard is the folder around them
    out = args.out or str(src.parent if recorded_title(src) is not None else leaderboard_dir(src))
    try:
        table = build(args.runs, out, args.title)
    except yaml.YAMLError as err:
        raise BadValue(f"a run's config.yaml does not parse ({err})") from err
    print(to_markdown(table))
    print(f"written: {out}/leaderboard.md, .csv, .html, .png")
    return 0


main = run_command(leaderboard_command)

if __name__ == "__main__":
    main()
