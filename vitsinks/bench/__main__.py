"""`python -m vitsinks.bench {models,train,diagnostics,eval,intervene} [--size NAME] [--batch N] [--repeats N]`."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vitsinks.bench", description=__doc__)
    parser.add_argument("what", choices=["models", "train", "diagnostics", "eval", "intervene"], help="which benchmark")
    parser.add_argument("--size", default=None, help="model size (default: vit_cpu; vit_small for diagnostics)")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    kw = {k: v for k, v in (("batch", args.batch), ("repeats", args.repeats)) if v is not None}
    if args.what == "models":
        from vitsinks.bench.models import run

        run(args.size or "vit_cpu", **kw)
    elif args.what == "train":
        from vitsinks.bench.train import run

        run(**kw)
    elif args.what == "diagnostics":
        from vitsinks.bench.diagnostics import run

        run(args.size or "vit_small", **kw)
    elif args.what == "intervene":
        from vitsinks.bench.intervene import run

        run(args.size or "vit_cpu", **kw)
    else:
        from vitsinks.bench.eval import run

        run(args.size or "vit_cpu", **kw)


if __name__ == "__main__":
    main()
