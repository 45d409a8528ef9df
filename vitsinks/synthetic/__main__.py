"""`python -m vitsinks.synthetic task=trigger|nop|broadcast|all [steps=1500] [seed=0] [out=runs/synthetic]`.

Trains the task's minimal transformer(s) on the CPU (well under a minute each), writes `<out>/<task>.json` and
`<out>/<task>.png`, and prints whether the diagnostics found what the task guarantees.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from vitsinks.synthetic.figures import FIGURES
from vitsinks.synthetic.tasks import TASKS


def main(argv: list[str]) -> int:
    schema = OmegaConf.structured({"task": "all", "steps": 1500, "seed": 0, "out": "runs/synthetic"})
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        result = TASKS[name](steps=args.steps, seed=args.seed)
        (out / f"{name}.json").write_text(json.dumps(result, indent=1))
        FIGURES[name](result, out / f"{name}.png")
        print(f"{name}: {out / (name + '.json')}, {out / (name + '.png')}")
        print(f"  expected: {result['expected']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
