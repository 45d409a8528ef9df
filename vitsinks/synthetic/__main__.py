"""`python -m vitsinks.synthetic task=trigger|nop|broadcast|broadcast_pathway|all [steps=N] [seed=0] [out=...]`.

Trains the task's minimal transformer(s) on the CPU, writes `<out>/<task>.json` and `<out>/<task>.png`, and prints
what the task guarantees. `broadcast_pathway` (SPEC section 7) also takes `n_seeds=` (seeds seed..seed+n-1),
`batch=`, `lr=` and `cm_penalty=` (lambda_B of its penalised arm); its defaults are the CPU setting of the README.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from vitsinks.synthetic.figures import FIGURES
from vitsinks.synthetic.tasks import TASKS

PATHWAY_ONLY = ("n_seeds", "batch", "lr", "cm_penalty")


def main(argv: list[str]) -> int:
    schema = OmegaConf.structured({"task": "all", "steps": None, "seed": 0, "out": "runs/synthetic", "n_seeds": None,
                                   "batch": None, "lr": None, "cm_penalty": None})
    OmegaConf.set_struct(schema, True)
    try:
        args = OmegaConf.merge(schema, OmegaConf.from_dotlist(argv))
    except Exception as err:  # noqa: BLE001 - omegaconf raises several kinds for bad keys / values
        print(f"error: {err}\nusage: {__doc__.splitlines()[0]}", file=sys.stderr)
        return 2
    names = list(TASKS) if args.task == "all" else [args.task]
    if any(n not in TASKS for n in names):
        print(f"error: unknown task {args.task!r}; choose one of {[*TASKS, 'all']}", file=sys.stderr)
        return 2
    extra = {k: args[k] for k in PATHWAY_ONLY if args[k] is not None}
    if extra and names != ["broadcast_pathway"]:
        print(f"error: {', '.join(extra)} apply to task=broadcast_pathway only", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        kwargs: dict[str, Any] = {"seed": args.seed, **extra}
        if args.steps is not None:
            kwargs["steps"] = args.steps
        result = TASKS[name](**kwargs)
        (out / f"{name}.json").write_text(json.dumps(result, indent=1))
        FIGURES[name](result, out / f"{name}.png")
        print(f"{name}: {out / (name + '.json')}, {out / (name + '.png')}")
        print(f"  expected: {result['expected']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
