"""Regenerate the pages made from the code: the options page and the variant lists.

    python -m vitsinks.docs > docs/commands-options.md    # every command's options (printed)
    python -m vitsinks.docs variants                       # README.md's variant list, docs/variants.md's table
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from vitsinks.configs.cli import run_command
from vitsinks.pages.options_page import GENERATOR, REPOSITORY, VARIANTS_GENERATOR, render, write_variants
from vitsinks.utils.errors import ConfigError


def variants_command() -> int:
    """Rewrite the variant list of README.md and the variant table of docs/variants.md from the exp config group."""
    changed = write_variants()
    print("written: " + (", ".join(str(p.relative_to(REPOSITORY)) for p in changed) or "nothing (up to date)"))
    return 0


def docs_command(argv: Sequence[str]) -> int:
    if list(argv) == ["variants"]:
        return variants_command()
    if argv:
        raise ConfigError(f"unexpected argument(s) {' '.join(argv)}; usage: {GENERATOR}, or {VARIANTS_GENERATOR}")
    sys.stdout.write(render())
    return 0


main = run_command(docs_command)

if __name__ == "__main__":
    main()
