"""`python -m vitsinks`: the commands of the package, one line each, found in the source (`configs.usage.commands`:
every module with an `if __name__ == "__main__":` block, and its docstring's first line)."""

from __future__ import annotations

import sys

from vitsinks.configs.usage import PACKAGE, commands

__all__ = ["PACKAGE", "commands", "main"]


def main() -> int:
    """Print the commands, one per line (`-h` / `--help` too)."""
    listed = commands()
    width = max(map(len, listed), default=0)
    print("vitsinks commands (python -m <command>; `python -m <command> --help` lists its options):")
    for name, line in listed.items():
        print(f"  {name:<{width}}  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
