"""The package's shape: no import cycle among vitsinks modules, no vitsinks import hidden inside a function, the
configs shipped inside the package."""

from __future__ import annotations

import ast
from pathlib import Path

import vitsinks
from vitsinks.configs.schema import config_dir, exp_names
from vitsinks.configs.variants import STUDY_VARIANTS

PACKAGE = Path(vitsinks.__file__).resolve().parent


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "configs/mmseg" in path.as_posix():  # mmseg's own config files, not modules of ours
            continue
        name = ".".join(("vitsinks", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text())
    return out


def _imported(node: ast.stmt, names: set[str]) -> set[str]:
    """The vitsinks modules an import statement loads."""
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        found = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    elif isinstance(node, ast.Import):
        found = {a.name for a in node.names}
    else:
        return set()
    return {m for m in found if m in names}


def _module_level_graph(mods: dict[str, ast.Module]) -> dict[str, set[str]]:
    names = set(mods)
    graph = {}
    for name, tree in mods.items():
        deps: set[str] = set()
        for node in tree.body:  # `if TYPE_CHECKING:` blocks are annotations only: not followed
            deps |= _imported(node, names)
        graph[name] = deps - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(u: str, stack: list[str]) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                found.append([*stack[stack.index(v):], v])
            elif v not in state:
                visit(v, stack)
        stack.pop()
        state[u] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_vitsinks_modules() -> None:
    mods = _modules()
    assert len(mods) > 50  # the whole package was read
    assert _cycles(_module_level_graph(mods)) == []


def test_no_vitsinks_import_inside_a_function() -> None:
    """A function-level import of our own modules is how a cycle hides; there is none."""
    mods = _modules()
    hidden = []
    for name, tree in mods.items():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                hidden += [f"{name}.{fn.name}" for node in ast.walk(fn) if _imported(node, set(mods))]
    assert hidden == []


def test_configs_are_inside_the_package_and_every_variant_composes() -> None:
    assert config_dir().is_relative_to(PACKAGE) and (config_dir() / "config.yaml").is_file()
    assert set(STUDY_VARIANTS) <= set(exp_names()) and len(exp_names()) > len(STUDY_VARIANTS)
