"""Benchmarks: side-by-side timings in one process, reported as ratios (absolute times mean little on a CPU).

    python -m vitsinks.bench WHAT [size=NAME] [batch=N] [repeats=N] [variants=A,B,...]

WHAT: models, train, diagnostics, eval, intervene, data, pretrained, gpu, or first-run (README command 1, timed whole).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass

from vitsinks.benchmarks.gpu import gpu_command
from vitsinks.configs.cli import parse_args, run_command
from vitsinks.utils.errors import ConfigError

# benchmark -> its default model size(s) (None: the benchmark takes none)
BENCHMARKS = {"models": "vit_cpu", "train": None, "diagnostics": "vit_small", "eval": "vit_cpu", "intervene": "vit_cpu",
              "data": None, "pretrained": "vit_small,vit_large", "gpu": "vit_large,vit_base", "first-run": None}
USAGE = "python -m vitsinks.bench WHAT [size=NAME] [batch=N] [repeats=N] [variants=A,B,...]"
PARTS = "vitsinks.benchmarks"  # where each benchmark lives
MODULES = {"intervene": "interventions", "first-run": "first_run"}  # a benchmark's module, where not its name


@dataclass
class BenchArgs:
    what: str | None = None
    size: str | None = None  # model size (default: the benchmark's)
    batch: int | None = None
    repeats: int | None = None
    variants: str | None = None  # models only: the exp names to measure, comma-separated (default: every one)


def bench_command(argv: Sequence[str]) -> int:
    if list(argv[:1]) == ["gpu"]:  # the GPU benchmark takes its own options (vitsinks.benchmarks.gpu)
        return gpu_command(argv[1:])
    args = parse_args(argv, BenchArgs, USAGE, positional="what")
    if args.what not in BENCHMARKS:
        raise ConfigError(f"which benchmark? choose one of {', '.join(BENCHMARKS)} (got {args.what!r})")
    kw = {k: args[k] for k in ("batch", "repeats") if args[k] is not None}
    if any(v <= 0 for v in kw.values()):
        raise ConfigError(f"batch and repeats must be > 0 (got {kw})")
    if args.variants is not None:
        if args.what != "models":
            raise ConfigError("variants= is an option of the models benchmark only (python -m vitsinks.bench models "
                              "variants=base,gate)")
        kw["variants"] = [v for v in str(args.variants).split(",") if v]
    run = importlib.import_module(f"{PARTS}.{MODULES.get(args.what, args.what)}").run
    default = BENCHMARKS[args.what]
    print(run(**kw) if default is None else run(args.size or default, **kw))
    return 0


main = run_command(bench_command)

if __name__ == "__main__":
    main()
