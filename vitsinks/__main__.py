"""`python -m vitsinks`: the commands of the package, one line each (found in the source, not a hand-kept list).

A command is a module that runs under `python -m` (it has an `if __name__ == "__main__":` block) or a package with a
`__main__.py`; its line is the first line of its docstring (a package's: its `__init__.py`'s).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _runs_as_main(tree: ast.Module) -> bool:
    """The module has a top-level `if __name__ == "__main__":` block."""
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [node.test.left, *node.test.comparators]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and \
                    any(isinstance(n, ast.Constant) and n.value == "__main__" for n in names):
                return True
    return False


def _first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) if path.is_file() else None
    return doc.strip().splitlines()[0].strip() if doc else ""


def commands(root: Path = PACKAGE) -> dict[str, str]:
    """`python -m` name -> one-line description, for every command under the package folder `root`, by name."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if path.name == "__main__.py":
            if path.parent == root:
                continue  # this listing itself
            found[".".join(parts[:-1])] = _first_line(path.parent / "__init__.py") or _first_line(path)
        elif path.name != "__init__.py" and _runs_as_main(ast.parse(path.read_text())):
            found[".".join(parts)] = _first_line(path)
    return dict(sorted(found.items()))


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
