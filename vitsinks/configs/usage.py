"""`--help` / `-h` of every command and sub-command, read from the command's source without importing it (so that
`python -m vitsinks.<command> --help`, answered by `early_help`, never imports torch), and the list of commands.
The text is the module's docstring and its config groups and short keys (a Hydra command), the fields of its
`*Args` dataclasses (a plain command), or a `<word>_command` function's docstring (a sub-command).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from vitsinks.configs.search import env_folders, options
from vitsinks.utils.errors import UserError

HELP_FLAGS = ("-h", "--help")
FLAGS_USAGE = "--cfg job|hydra|all [--resolve] (print the composed config), --help"
CONFIG_DIR = Path(__file__).resolve().parent
PACKAGE = CONFIG_DIR.parent


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
    """`python -m` name -> its docstring's first line, for every module under the package folder `root` with an
    `if __name__ == "__main__":` block."""
    found = {".".join(path.relative_to(root.parent).with_suffix("").parts): _first_line(path)
             for path in sorted(root.rglob("*.py"))
             if path.name not in ("__init__.py", "__main__.py") and _runs_as_main(ast.parse(path.read_text()))}
    return dict(sorted(found.items()))


def wants_help(argv: Sequence[str]) -> bool:
    """The command line asks for help (`-h` or `--help` anywhere)."""
    return any(a in HELP_FLAGS for a in argv)


def help_text(doc: str | None, aliases: dict[str, str]) -> str:
    """A Hydra command's `--help`: its module docstring, the config groups with their options, and its aliases."""
    lines = [(doc or "").strip(), "", ("config groups (group=option; the package's and the user's: "
                                     "$VITSINKS_CONFIGS, ./configs, the checkout's configs/):")]
    lines += [f"  {group}: {', '.join(found)}" for group, found in options().items()]
    try:
        env_folders()
    except UserError as err:  # help still answers; the command itself stops on it
        lines.append(f"  note: {err}")
    if aliases:
        lines += ["", "short keys: " + ", ".join(f"{k}= ({v}=)" for k, v in aliases.items())]
    lines += ["", f"any field: key=value (e.g. train.lr=1e-3); options: {FLAGS_USAGE}"]
    return "\n".join(lines)


@dataclass(frozen=True)
class Source:
    """A command's source: `command` (its `python -m` name) and `path` (its module's file)."""

    command: str
    path: Path

    @classmethod
    def of(cls, command: str) -> Source:
        """The source of `python -m <command>`; a `LookupError` when no such vitsinks module exists."""
        parts = command.split(".")
        if parts[0] == PACKAGE.name and len(parts) > 1:
            base = PACKAGE.parent.joinpath(*parts)
            if base.with_suffix(".py").is_file() and _runs_as_main(ast.parse(base.with_suffix(".py").read_text())):
                return cls(".".join(parts), base.with_suffix(".py"))
        raise LookupError(f"{command} is not a vitsinks command (python -m vitsinks lists them)")

    @cached_property
    def text(self) -> str:
        return self.path.read_text()

    @cached_property
    def tree(self) -> ast.Module:
        return ast.parse(self.text)

    @property
    def doc(self) -> str:
        """The command module's docstring."""
        return (ast.get_docstring(self.tree, clean=False) or "").strip()

    @cached_property
    def constants(self) -> dict[str, Any]:
        """The module's top-level `NAME = <literal>` assignments."""
        out: dict[str, Any] = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    out[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
        return out

    def calls(self, name: str) -> list[ast.Call]:
        """Every call of the function `name` in the module."""
        return [n for n in ast.walk(self.tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                and n.func.id == name]

    def keyword(self, call: ast.Call, name: str) -> Any:
        """The value of keyword argument `name` of `call` (None when absent), evaluated on `constants` alone."""
        for kw in call.keywords:
            if kw.arg == name:
                code = compile(ast.Expression(kw.value), str(self.path), "eval")
                return eval(code, {"__builtins__": {}, **self.constants})  # noqa: S307 - the package's own source
        return None

    @property
    def is_hydra(self) -> bool:
        """The command composes the run config (its module calls `hydra_command`)."""
        return bool(self.calls("hydra_command"))

    def aliases(self) -> dict[str, str]:
        """A Hydra command's short keys: the `aliases=` of its `hydra_command` call."""
        found = [self.keyword(c, "aliases") for c in self.calls("hydra_command")]
        return dict(next((a for a in found if a), {}))

    def subcommands(self) -> dict[str, str]:
        """Sub-command word -> its docstring: the module's `<word>_command` functions, but the command's own."""
        words = {fn.name.removesuffix("_command"): fn for fn in self.tree.body
                 if isinstance(fn, ast.FunctionDef) and fn.name.endswith("_command")}
        return {word: (ast.get_docstring(fn) or "").strip() for word, fn in words.items()
                if word != self.command.split(".")[-1]}

    def default(self, node: ast.expr) -> str:
        """A field's default as written, evaluated where it can be (the module's constants, `default_factory`)."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "field":
            factory = next((k.value for k in node.keywords if k.arg == "default_factory"), None)
            node = factory.body if isinstance(factory, ast.Lambda) else node
            if isinstance(factory, ast.Name) and factory.id in ("list", "dict"):
                return "[]" if factory.id == "list" else "{}"
        try:
            code = compile(ast.Expression(node), str(self.path), "eval")
            return repr(eval(code, {"__builtins__": {"list": list, "tuple": tuple}, **self.constants}))  # noqa: S307
        except Exception:  # noqa: BLE001 - anything else is shown as written
            return ast.unparse(node)

    def argument_lines(self) -> list[str]:
        """A plain command's arguments: the fields of its `*Args` dataclasses, `key=<type> (default ...): comment`."""
        positional = {self.keyword(c, "positional") for c in self.calls("parse_args")} - {None}
        lines = self.text.splitlines()
        out = []
        for cls in (n for n in self.tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Args")):
            for st in cls.body:
                if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                    continue
                key = st.target.id
                line = f"  {key}=<{ast.unparse(st.annotation)}>"
                if st.value is not None:
                    line += f" (default {self.default(st.value)})"
                if key in positional:
                    line += " (or as the first bare word)"
                comment = lines[(st.end_lineno or st.lineno) - 1][st.end_col_offset or 0:].strip()
                if comment.startswith("#"):
                    line += ": " + comment.lstrip("#").strip()
                out.append(line)
        return out


def command_help(command: str, argv: Sequence[str] = ()) -> str:
    """The `--help` of `python -m <command> <argv>` (a sub-command's when the first bare word of `argv` names one)."""
    src = Source.of(command)
    words = [a for a in argv if "=" not in a and not a.startswith("-")]
    subs = src.subcommands()
    if words and words[0] in subs:
        return f"python -m {src.command} {words[0]}: {subs[words[0]]}\n\noptions: -h, --help (this text)"
    parts = src.constants.get("PARTS")  # the package of a command's parts (`bench models`: vitsinks.benchmarks.models)
    part = PACKAGE.parent.joinpath(*parts.split("."), f"{words[0]}.py") if words and parts else None
    if src.is_hydra:
        text = help_text(src.doc, src.aliases())
    else:
        args = src.argument_lines()
        text = src.doc + ("\n\narguments (key=value):\n" + "\n".join(args) if args else "")
        text += "\n\noptions: -h, --help (this text)"
    if part is not None and part.is_file():  # `bench gpu --help`: the part's own docstring and arguments too
        sub = Source(f"{src.command} {words[0]}", part)
        args = sub.argument_lines()
        text += f"\n\n{sub.doc}" if sub.doc.startswith("`python -m") else f"\n\npython -m {sub.command}: {sub.doc}"
        text += "\n\narguments (key=value):\n" + "\n".join(args) if args else ""
    if subs:
        text += f"\n\nsub-commands (python -m {src.command} <word> --help): {', '.join(subs)}"
    return text


def answer_help() -> None:
    """Print the help and exit 0 when `python -m vitsinks.<command>` was run with `-h` / `--help`; else return."""
    orig = list(getattr(sys, "orig_argv", []))  # while `python -m` imports its packages, sys.argv[0] is "-m"
    at = orig.index("-m", 1) if "-m" in orig[1:] else -1
    if sys.argv[:1] != ["-m"] or not 0 < at < len(orig) - 1 or not wants_help(orig[at + 2:]):
        return
    try:
        text = command_help(orig[at + 1], orig[at + 2:])
    except LookupError:
        return  # not a command of this package (or `python -m vitsinks`, the listing): it prints its own
    print(text)
    sys.stdout.flush()
    sys.exit(0)
