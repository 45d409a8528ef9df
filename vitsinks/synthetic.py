"""Synthetic tasks with a known answer about attention sinks (trigger, nop, broadcast).

    python -m vitsinks.synthetic task=trigger|nop|broadcast|broadcast_pathway|all [steps=N] [seed=0] [out=...]

Trains the task's minimal transformer(s), writes `<out>/<task>.json` and `<out>/<task>.png` and prints what the task
guarantees. `broadcast_pathway` also takes `n_seeds=`, `batch=`, `lr=`, `cm_penalty=` (lambda_B of its penalised arm)
and `device=`; `n_seeds=5 steps=30000 batch=1024 lr=5e-4 device=cuda` is the reference's setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from vitsinks.configs.cli import parse_args, run_command
from vitsinks.sinktasks.figures import FIGURES
from vitsinks.sinktasks.tasks import TASKS
from vitsinks.utils import files
from vitsinks.utils.errors import ConfigError

PATHWAY_ONLY = ("n_seeds", "batch", "lr", "cm_penalty", "device")


@dataclass
class SyntheticArgs:
    task: str = "all"
    steps: int | None = None
    seed: int = 0
    out: str = "runs/synthetic"
    n_seeds: int | None = None
    batch: int | None = None
    lr: float | None = None
    cm_penalty: float | None = None
    device: str | None = None


def synthetic_command(argv: Sequence[str]) -> int:
    usage = __doc__.splitlines()[2].strip()
    args = parse_args(argv, SyntheticArgs, usage)
    names = list(TASKS) if args.task == "all" else [args.task]
    if any(n not in TASKS for n in names):
        raise ConfigError(f"unknown task {args.task!r}; choose one of {[*TASKS, 'all']}")
    given = {k: args[k] for k in ("steps", *PATHWAY_ONLY) if args[k] is not None}
    extra = [k for k in given if k != "steps"]
    if extra and names != ["broadcast_pathway"]:
        raise ConfigError(f"{', '.join(extra)} apply to task=broadcast_pathway only")
    bad = [f"{k}={args[k]}" for k in ("steps", "n_seeds", "batch", "lr") if args[k] is not None and args[k] <= 0]
    if bad:
        raise ConfigError(f"{', '.join(bad)}: must be > 0")
    if args.device is not None:
        try:
            torch.device(args.device)
        except RuntimeError as err:
            raise ConfigError(f"device={args.device}: {err}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        result = TASKS[name](seed=args.seed, **given)
        files.write_json(out / f"{name}.json", result)
        FIGURES[name](result, out / f"{name}.png")
        print(f"{name}: {out / (name + '.json')}, {out / (name + '.png')}")
        print(f"  expected: {result['expected']}")
    return 0


main = run_command(synthetic_command)

if __name__ == "__main__":
    main()
