"""The tests' own layout: a test module never imports another test module or a conftest.py (tests share helpers
through tests/helpers/ or a conftest.py's fixtures), and a module that is neither a test module, a conftest.py nor a
package's docstring-only `__init__.py` lives in tests/helpers/."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HELPERS = "helpers"


def _module(path: Path, root: Path) -> str:
    """The dotted name of `path` (a .py file under `root`, the tests' package)."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, root: Path) -> list[str]:
    """Every module name an import of `path` may name (relative imports resolved; `from a import b`: a and a.b)."""
    package = _module(path, root) if path.name == "__init__.py" else _module(path, root).rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return names


def _docstring_only(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
               for n in body)


def violations(root: Path) -> list[str]:
    """What breaks the layout in the tests' package `root`: imports of a test module or a conftest.py, and shared
    code outside `root/helpers` (a module other than test_*.py, conftest.py, or an `__init__.py` with code)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        for name in _imported(path, root):
            first, _, last = name.rpartition(".")
            if (first == root.name or first.startswith(root.name + ".")) and (last.startswith("test_")
                                                                               or last == "conftest"):
                out.append(f"{rel} imports {name}")
        inside_helpers = rel.parts[0] == HELPERS
        shared = not (path.name.startswith("test_") or path.name == "conftest.py")
        if shared and not inside_helpers and not (path.name == "__init__.py" and _docstring_only(path)):
            out.append(f"{rel} is shared code outside {root.name}/{HELPERS}/")
    return sorted(set(out))


def test_the_checker_finds_each_kind_of_breach(tmp_path: Path) -> None:
    root = tmp_path / "tests"
    files = {
        "__init__.py": "",
        "helpers/__init__.py": '"""Shared."""\n',
        "helpers/tiny.py": "def tiny() -> int:\n    return 1\n",
        "conftest.py": "from tests.helpers.tiny import tiny\n",
        "a/__init__.py": '"""Tests of a."""\n',
        "a/test_one.py": "from tests.helpers import tiny\n\n\ndef shared() -> int:\n    return 1\n",
        "a/test_two.py": "from tests.a.test_one import shared\n",
        "a/test_three.py": "def test_x() -> None:\n    from .test_one import shared  # noqa\n",
        "a/test_four.py": "from tests.a import test_one\nimport tests.conftest\n",
        "a/test_five.py": "from ..conftest import tiny\n",
        "b/__init__.py": "X = 1\n",
        "b/util.py": "Y = 2\n",
        "b/test_ok.py": "import vitsinks.posthoc.test_time_register\nfrom tests.helpers.tiny import tiny\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert violations(root) == [
        "a/test_five.py imports tests.conftest", "a/test_four.py imports tests.a.test_one",
        "a/test_four.py imports tests.conftest",
        "a/test_three.py imports tests.a.test_one", "a/test_two.py imports tests.a.test_one",
        "b/__init__.py is shared code outside tests/helpers/", "b/util.py is shared code outside tests/helpers/"]


def test_no_test_module_imports_another_and_shared_code_lives_in_helpers() -> None:
    assert (TESTS / HELPERS / "__init__.py").is_file()
    assert violations(TESTS) == []
