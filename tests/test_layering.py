"""The package's layering, as docs/architecture.md states it, held on every import of the source.

The page's layer table is the one statement: this module reads it (`read_layers`) and checks every `import` and
`from ... import` of every module of `vitsinks`, those inside functions included, against it. The rules:

- `climbs`: a module imports only from its own layer or the layers below it;
- `command`: a library module (any layer but `commands`) never imports a command module;
- `cycle`: no two packages import each other, directly or through others (commands left out: they sit on top);
- `init`: an `__init__.py` only re-exports (its docstring, imports, `__all__`, dunder names, and
  `import_members(__name__)`: the registration imports of the package's modules);
- `placed`: every module has a layer, every module that runs under `python -m` is in the commands layer, and every
  module the table names exists;
- `apart`: a package holds command modules or library modules, never both (`__init__.py` files apart).

`test_the_checker_catches_each_planted_violation` runs the same checks over a small package written for the test,
with one violation of each rule planted, so that none of these tests can pass by checking nothing.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "vitsinks"
TABLE_HEADING = "## The layers"
COMMANDS = "commands"


@dataclass(frozen=True)
class Layer:
    rank: int
    name: str
    modules: tuple[str, ...]


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer} (line {self.line}) imports {self.imported}"


def read_layers(text: str) -> list[Layer]:
    """The layer table under `TABLE_HEADING`: rows `| rank | name | `module`, ... |`, highest rank on top."""
    if TABLE_HEADING not in text:
        raise AssertionError(f"docs/architecture.md has no {TABLE_HEADING!r} section with the layer table")
    rows = []
    for line in text.split(TABLE_HEADING, 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if rows and not line.startswith("|"):
            break  # the table's end
        if len(cells) >= 3 and cells[0].isdigit():
            rows.append(Layer(int(cells[0]), cells[1], tuple(re.findall(r"`([\w.]+)`", cells[2]))))
    ranks = [r.rank for r in rows]
    assert rows and len(set(ranks)) == len(ranks), f"the layer table needs rows of distinct ranks, got {ranks}"
    return sorted(rows, key=lambda r: r.rank)


def modules_of(package: Path) -> dict[str, Path]:
    """Every module under the package folder `package`, by dotted name (a package by its `__init__.py`)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _nearest(name: str, modules: dict[str, Path]) -> str | None:
    """`name` or the nearest package above it that is a module of ours (`a.b.func` -> `a.b`)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in modules else None


def imports_of(modules: dict[str, Path]) -> list[Import]:
    """Every import of one of `modules` by one of them: `import`, `from ... import` (relative ones resolved, a
    name that is a submodule counted as that submodule) and `importlib.import_module("<literal>")`, anywhere in the
    module (inside functions and `if TYPE_CHECKING:` too)."""
    found = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
                    "import_module" and node.args and isinstance(node.args[0], ast.Constant):
                targets = [str(node.args[0].value)]
            for target in targets:
                hit = _nearest(target, modules)
                if hit is not None and hit != name:
                    found.append(Import(name, hit, node.lineno))
    return found


def runs_as_command(path: Path) -> bool:
    """A `__main__.py`, or a module with a top-level `if __name__ == "__main__":` block."""
    if path.name == "__main__.py":
        return True
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            sides = [node.test.left, *node.test.comparators]
            if any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and \
                    any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides):
                return True
    return False


class Layering:
    """The layers of a page over the modules of one package."""

    def __init__(self, layers: list[Layer], package: Path) -> None:
        self.layers = layers
        self.root = package.name
        self.modules = modules_of(package)
        self.imports = imports_of(self.modules)
        self.top = max(layers, key=lambda r: r.rank)

    def layer_of(self, module: str) -> Layer | None:
        """The layer of the longest module prefix the table names (the package itself: only when named)."""
        best: tuple[int, Layer] | None = None
        for layer in self.layers:
            for prefix in layer.modules:
                hit = module == prefix or (prefix != self.root and module.startswith(prefix + "."))
                if hit and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), layer)
        return best[1] if best else None

    def is_command(self, module: str) -> bool:
        return self.layer_of(module) == self.top

    def package_of(self, module: str) -> str:
        """`vitsinks.<name>`: the top-level package (or module) that `module` belongs to."""
        return ".".join(module.split(".")[:2])

    def unplaced(self) -> list[str]:
        """Modules without a layer, runnable modules outside the commands layer, named modules that do not exist."""
        out = [f"{m} has no layer in docs/architecture.md (rule placed: add its package to the layer table)"
               for m in self.modules if self.layer_of(m) is None]
        out += [f"{m} runs under python -m but is in layer {self.layer_of(m).rank} {self.layer_of(m).name}, not in "
                f"{self.top.name} (rule placed: list it in the commands layer)"
                for m, p in self.modules.items() if runs_as_command(p) and self.layer_of(m) not in (None, self.top)]
        out += [f"{m} is in layer {r.rank} {r.name} of docs/architecture.md but is no module of {self.root} (rule "
                f"placed)" for r in self.layers for m in r.modules if m not in self.modules]
        if self.top.name != COMMANDS:
            out.append(f"the top layer is {self.top.name!r}; it must be {COMMANDS!r} (rule placed)")
        return out

    def climbing(self) -> list[str]:
        """Imports of a higher layer (commands apart: `commanding`)."""
        out = []
        for imp in self.imports:
            a, b = self.layer_of(imp.importer), self.layer_of(imp.imported)
            if a and b and b.rank > a.rank and b != self.top:
                out.append(f"{imp}: layer {a.rank} {a.name} may not import layer {b.rank} {b.name} (rule climbs: "
                           f"a module imports only its own layer and those below, docs/architecture.md)")
        return out

    def commanding(self) -> list[str]:
        """Library modules importing a command module."""
        return [f"{imp}, a command module: a library module never imports a command (rule command: move what it "
                f"needs into the library, docs/architecture.md)"
                for imp in self.imports if not self.is_command(imp.importer) and self.is_command(imp.imported)
                and self.layer_of(imp.importer) is not None]

    def cycles(self) -> list[str]:
        """Packages that import each other: each pair directly, named with one import each way; then the longer
        loops within a layer (Tarjan's strongly connected components of the package graph without the imports that
        climb, which `climbing` names), each named with the imports that join it."""
        edges: dict[tuple[str, str], Import] = {}
        level: dict[tuple[str, str], Import] = {}
        for imp in self.imports:
            a, b = self.package_of(imp.importer), self.package_of(imp.imported)
            if a != b and not self.is_command(imp.importer) and not self.is_command(imp.imported):
                edges.setdefault((a, b), imp)
                low, high = self.layer_of(imp.importer), self.layer_of(imp.imported)
                if low is not None and high is not None and high.rank <= low.rank:
                    level.setdefault((a, b), imp)
        rule = "(rule cycle: no two packages import each other, docs/architecture.md)"
        out = [f"packages {a} and {b} import each other ({edges[a, b]}; {edges[b, a]}) {rule}"
               for a, b in sorted(edges) if a < b and (b, a) in edges]
        for group in _components({p for edge in level for p in edge}, level):
            if len(group) > 2:
                joins = "; ".join(str(imp) for (a, b), imp in sorted(level.items()) if a in group and b in group)
                out.append(f"packages {', '.join(sorted(group))} import each other through one another ({joins}) "
                           f"{rule}")
        return out

    def init_logic(self) -> list[str]:
        """Statements of an `__init__.py` other than its docstring, imports, `__all__`, dunder names, `if
        TYPE_CHECKING:` imports and `import_members(__name__)`."""
        out = []
        for name, path in self.modules.items():
            if path.name != "__init__.py":
                continue
            body = ast.parse(path.read_text()).body
            for i, node in enumerate(body):
                if not _re_exports(node, first=i == 0):
                    what = ast.get_source_segment(path.read_text(), node) or type(node).__name__
                    out.append(f"{name} (line {node.lineno}) has `{what.splitlines()[0][:60]}`: an __init__.py "
                               f"only re-exports (rule init: move it into a module of the package)")
        return out

    def mixed(self) -> list[str]:
        """Packages holding both command and library modules."""
        kinds: dict[str, set[bool]] = {}
        for m, p in self.modules.items():
            if p.name != "__init__.py" and self.layer_of(m) is not None:
                kinds.setdefault(m.rpartition(".")[0], set()).add(self.is_command(m))
        return [f"package {pkg} holds command and library modules (rule apart: move the library modules to a library "
                f"package)" for pkg, seen in sorted(kinds.items()) if len(seen) == 2]

    def violations(self) -> list[str]:
        return self.unplaced() + self.climbing() + self.commanding() + self.cycles() + self.init_logic() + self.mixed()


def _re_exports(node: ast.stmt, first: bool) -> bool:
    if isinstance(node, ast.Import | ast.ImportFrom):
        return True
    if first and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and \
            isinstance(node.value.value, str):
        return True  # the docstring
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return all(isinstance(t, ast.Name) and t.id.startswith("__") and t.id.endswith("__") for t in targets)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
            ast.unparse(node.value) == "import_members(__name__)":
        return True  # a registry imports the package's modules, each registering itself (`utils.registry`)
    if isinstance(node, ast.If) and isinstance(node.test, ast.Name | ast.Attribute) and \
            ast.unparse(node.test).endswith("TYPE_CHECKING"):
        return all(isinstance(n, ast.Import | ast.ImportFrom) for n in node.body + node.orelse)
    return False


def _components(nodes: Iterable[str], edges: dict[tuple[str, str], Import]) -> list[set[str]]:
    """The strongly connected components of the graph `edges` over `nodes` (Tarjan)."""
    succ: dict[str, list[str]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            out.append(group)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def layering() -> Layering:
    return Layering(read_layers(PAGE.read_text()), PACKAGE)


def _report(found: list[str]) -> str:
    return f"{len(found)} violation(s) of docs/architecture.md:\n" + "\n".join(found)


def test_the_page_states_the_layers_bottom_to_top(layering: Layering) -> None:
    names = [r.name for r in layering.layers]
    assert layering.layers[0].modules == ("vitsinks.utils",) and names[-1] == COMMANDS, names
    assert len(layering.imports) > 500  # the checker reads the real import graph


def test_every_module_has_its_layer(layering: Layering) -> None:
    found = layering.unplaced()
    assert not found, _report(found)


def test_no_import_climbs_the_layers(layering: Layering) -> None:
    found = layering.climbing()
    assert not found, _report(found)


def test_no_library_module_imports_a_command(layering: Layering) -> None:
    found = layering.commanding()
    assert not found, _report(found)


def test_no_two_packages_import_each_other(layering: Layering) -> None:
    found = layering.cycles()
    assert not found, _report(found)


def test_init_files_only_re_export(layering: Layering) -> None:
    found = layering.init_logic()
    assert not found, _report(found)


def test_commands_and_library_never_share_a_package(layering: Layering) -> None:
    found = layering.mixed()
    assert not found, _report(found)


PLANTED_PAGE = f"""# a package's layers

{TABLE_HEADING}

| rank | layer | modules |
|---|---|---|
| 3 | commands | `pkg.cmd` |
| 2 | high | `pkg.high` |
| 1 | mid | `pkg.mid`, `pkg.side`, `pkg.r1`, `pkg.r2`, `pkg.r3` |
| 0 | low | `pkg`, `pkg.low` |

Text after the table is not read.
"""


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


CLEAN = {
    "pkg/__init__.py": '"""The package."""\n\n__version__ = "1"\n',
    "pkg/low/__init__.py": '"""Low."""\n\nfrom pkg.low import a  # noqa: F401 - registers\nfrom pkg.low.a import f\n\n'
                           '__all__ = ["f"]\n',
    "pkg/low/a.py": "def f() -> int:\n    return 1\n",
    "pkg/mid/__init__.py": "from pkg.low.a import f as import_members\n\nimport_members(__name__)\n",
    "pkg/mid/x.py": "from ..low import a\n",
    "pkg/side/__init__.py": "",
    "pkg/side/y.py": "import pkg.mid.x\n",
    "pkg/high/__init__.py": "",
    "pkg/high/b.py": "from pkg.side import y\n",
    "pkg/cmd.py": 'from pkg.high import b\n\nif __name__ == "__main__":\n    b\n',
    "pkg/r1/__init__.py": "import pkg.r2\n",
    "pkg/r2/__init__.py": "import pkg.r3\n",
    "pkg/r3/__init__.py": "",
}


def test_the_checker_passes_a_clean_package(tmp_path: Path) -> None:
    checked = Layering(read_layers(PLANTED_PAGE), _plant(tmp_path, CLEAN))
    assert len(checked.imports) == 9 and checked.violations() == []


def test_the_checker_catches_each_planted_violation(tmp_path: Path) -> None:
    planted = {
        **CLEAN,
        "pkg/low/a.py": "def f() -> int:\n    from pkg.high import b  # climbs, inside a function\n    return 1\n",
        "pkg/mid/x.py": "import importlib\n\nfrom ..side import y  # a cycle with side\n\n"
                        "importlib.import_module('pkg.cmd')  # a command\n",
        "pkg/high/__init__.py": "def helper() -> None:\n    pass\n",
        "pkg/high/run.py": 'if __name__ == "__main__":\n    pass\n',
        "pkg/stray/__init__.py": "",
        "pkg/r3/__init__.py": "import pkg.r1  # a loop of three\n",
    }
    planted["pkg/high/c.py"] = ""  # a command module beside the library's
    page = PLANTED_PAGE.replace("| `pkg.cmd` |", "| `pkg.cmd`, `pkg.high.c` |")
    found = Layering(read_layers(page), _plant(tmp_path, planted)).violations()
    expected = [
        "pkg.stray has no layer",
        "pkg.high.run runs under python -m but is in layer 2 high",
        "pkg.low.a (line 2) imports pkg.high.b: layer 0 low may not import layer 2 high (rule climbs",
        "pkg.mid.x (line 5) imports pkg.cmd, a command module: a library module never imports a command (rule "
        "command",
        "packages pkg.mid and pkg.side import each other (pkg.mid.x (line 3) imports pkg.side.y; pkg.side.y (line 1) "
        "imports pkg.mid.x) (rule cycle",
        "packages pkg.r1, pkg.r2, pkg.r3 import each other through one another (pkg.r1 (line 1) imports pkg.r2; "
        "pkg.r2 (line 1) imports pkg.r3; pkg.r3 (line 1) imports pkg.r1) (rule cycle",
        "pkg.high (line 1) has `def helper() -> None:`: an __init__.py only re-exports (rule init",
        "package pkg.high holds command and library modules (rule apart",
    ]
    assert len(found) == len(expected), _report(found)
    for want in expected:
        assert any(f.startswith(want) for f in found), f"not caught: {want}\n{_report(found)}"


def test_a_page_without_the_table_is_refused() -> None:
    with pytest.raises(AssertionError, match="no '## The layers' section"):
        read_layers("# architecture\n\nno table here\n")
