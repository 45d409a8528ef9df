"""`python -m vitsinks.bench {models,train} [--size vit_cpu] [--batch N] [--repeats N]`."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vitsinks.bench", description=__doc__)
    parser.add_argument("what", choices=["models", "train"], help="which benchmark")
    parser.add_argument("--size", default="vit_cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    if args.what == "models":
        from vitsinks.bench.models import run

        run(args.size, args.batch, args.repeats)
    else:
        from vitsinks.bench.train import run

        run(args.batch, args.repeats)


if __name__ == "__main__":
    main()
