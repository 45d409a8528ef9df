"""The mmsegmentation configs of the dense probe's mmseg backend (`eval.dense_backend=mmseg`): found in the user's
config folders before the package's, and read without being run.

A config is a file `mmseg/<name>.py` in a config folder (`configs.search`: `$VITSINKS_CONFIGS`, `./configs`, the
checkout's `configs/`, then the package's `vitsinks/configs/`), in mmseg's own style: assignments of `dict(...)`,
lists, tuples, numbers and strings, and `_base_ = [...]` naming the files it builds on. A base is found by its name in
the same folders, first match winning, so a user's `mmseg/_linear.py` replaces the package's for every config that
builds on it (and may build on the package's one, naming itself as its base). The files are merged as mmengine
merges them (a dict of the child merged into the base's dict of that key, `_delete_=True` replacing it instead; any
other value replacing the base's). The command's own numbers (`size`, `width`, `classes`, ...; `COMMAND_NAMES`) are
names the files may use.

Reading never runs a file: anything but those assignments (an import, a function, a call other than `dict`) is a
`BadValue` naming its line.
"""

from __future__ import annotations

import ast
import copy
import operator
from pathlib import Path
from typing import Any

from vitsinks.configs.search import search_path
from vitsinks.utils.errors import BadValue, InputNotFound

GROUP = "mmseg"
BASE_KEY, DELETE_KEY = "_base_", "_delete_"
# the names a config may use, which the command defines (docs/evaluation.md)
COMMAND_NAMES = ("size", "width", "depth", "classes", "data_root", "workers", "epochs", "lr", "weight_decay",
                 "batch_size")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def folders() -> list[Path]:
    """The `mmseg/` config folders, highest priority first (the user's, then the package's)."""
    return [f / GROUP for f in search_path(strict=False) if (f / GROUP).is_dir()]


def names() -> list[str]:
    """The configs a command can name (`eval.dense_mmseg_config`): every `mmseg/<name>.py` not starting with `_`."""
    return sorted({p.stem for f in folders() for p in f.glob("*.py") if not p.stem.startswith("_")})


def find(name: str, replacing: Path | None = None) -> Path:
    """The file of config `name` (`<name>.py`, or a base's file name), the first of the config folders'; the base of
    a file of the same name (`replacing`) is the next one, the file it replaces."""
    file = name if name.endswith(".py") else f"{name}.py"
    for folder in folders():
        if (folder / file).is_file() and (folder / file).resolve() != replacing:
            return folder / file
    raise InputNotFound(f"no mmseg config {file} in {', '.join(str(f) for f in folders())}: choose one of "
                        f"{', '.join(names())} (eval.dense_mmseg_config), or add {file} to configs/{GROUP}/")


def read(path: Path, bound: dict[str, Any] | None = None) -> dict[str, Any]:
    """Config `path` with its bases merged in, as a dict; `bound`: the values of the command's names."""
    return _read(path, dict(bound or {}), ())


def _read(path: Path, bound: dict[str, Any], chain: tuple[Path, ...]) -> dict[str, Any]:
    if path in chain:
        raise BadValue(f"{path}: its _base_ files include it again ({' -> '.join(p.name for p in (*chain, path))})")
    own = _evaluate(path, bound)
    bases = own.pop(BASE_KEY, [])
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        if not isinstance(base, str):
            raise BadValue(f"{path}: _base_ holds {base!r}; name each base file as a string")
        values = _read(find(Path(base).name, replacing=path.resolve()), bound, (*chain, path))
        if twice := sorted(set(values) & set(merged)):
            raise BadValue(f"{path}: its bases both set {', '.join(twice)}; set each key in one base")
        merged.update(values)
    return merge(own, merged)


def merge(child: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """`child` merged into `base` as mmengine merges configs (neither is changed)."""
    out = copy.deepcopy(base)
    for key, value in child.items():
        if isinstance(value, dict):
            value = dict(value)
            if key in out and isinstance(out[key], dict) and not value.pop(DELETE_KEY, False):
                out[key] = merge(value, out[key])
                continue
            value.pop(DELETE_KEY, None)
        out[key] = copy.deepcopy(value)
    return out


def _evaluate(path: Path, bound: dict[str, Any]) -> dict[str, Any]:
    """The names `path` assigns, evaluated over literals, `dict(...)` and the names above them."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError as err:
        raise BadValue(f"{path}:{err.lineno}: not a config file ({err.msg})") from err
    scope, out = dict(bound), {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # a docstring
        if not (isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets)):
            raise _unread(path, stmt)
        value = _value(stmt.value, scope, path)
        for target in stmt.targets:
            scope[target.id] = out[target.id] = value  # type: ignore[attr-defined]  # checked above
    return out


def _value(node: ast.AST, scope: dict[str, Any], path: Path) -> Any:
    match node:
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name) if name in scope:
            return copy.deepcopy(scope[name])
        case ast.Name(id=name):
            bound = f" (the command defines {', '.join(COMMAND_NAMES)})"
            raise BadValue(f"{path}:{node.lineno}: {name} is not assigned above its use{bound}")
        case ast.List(elts=elts):
            return [_value(e, scope, path) for e in elts]
        case ast.Tuple(elts=elts):
            return tuple(_value(e, scope, path) for e in elts)
        case ast.Dict(keys=keys, values=values):
            return _items([(k, v) for k, v in zip(keys, values, strict=True)], scope, path, node)
        case ast.Call(func=ast.Name(id="dict"), args=[], keywords=keywords):
            return _items([(kw.arg, kw.value) for kw in keywords], scope, path, node)
        case ast.UnaryOp(op=ast.USub() | ast.UAdd() as op, operand=operand):
            value = _value(operand, scope, path)
            return -value if isinstance(op, ast.USub) else +value
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _OPS:
            try:
                return _OPS[type(op)](_value(left, scope, path), _value(right, scope, path))
            except (TypeError, ZeroDivisionError) as err:
                raise BadValue(f"{path}:{node.lineno}: {ast.unparse(node)}: {err}") from err
        case ast.Subscript(value=value, slice=index):
            try:
                return _value(value, scope, path)[_value(index, scope, path)]
            except (TypeError, KeyError, IndexError) as err:
                raise BadValue(f"{path}:{node.lineno}: {ast.unparse(node)}: {err!r}") from err
    raise _unread(path, node)


def _items(pairs: list[tuple[ast.expr | str | None, ast.expr]], scope: dict[str, Any], path: Path,
           node: ast.AST) -> dict[Any, Any]:
    """A dict from (key, value) nodes of a dict display or `dict(...)` (key None: `**` unpacking a dict)."""
    out: dict[Any, Any] = {}
    for key, node_value in pairs:
        value = _value(node_value, scope, path)
        if key is None and not isinstance(value, dict):
            raise _unread(path, node)
        if key is None:
            out.update(value)
        else:
            out[key if isinstance(key, str) else _value(key, scope, path)] = value
    return out


def _unread(path: Path, node: ast.AST) -> BadValue:
    text = ast.unparse(node).splitlines()[0][:80]
    if "_base_." in text:
        how = "write the value itself (mmengine's {{_base_.name}} templates are not read here)"
    else:
        how = ("a config holds assignments of numbers, strings, lists, tuples, dict(...) and names assigned above "
               "them; it is read, never run")
    return BadValue(f"{path}:{getattr(node, 'lineno', '?')}: `{text}` cannot be read: {how}")


def config_for(name: str, data: str) -> Path:
    """The file of config `name` for `data` (`mmseg/<name>_<data>.py`, `eval.dense_mmseg_config`)."""
    choices = sorted(n.removesuffix(f"_{data}") for n in names() if n.endswith(f"_{data}"))
    if name not in choices:
        raise InputNotFound(f"eval.dense_mmseg_config={name}: no mmseg/{name}_{data}.py in the config folders "
                            f"({', '.join(str(f) for f in folders())}); choose one of {', '.join(choices) or 'none'}, "
                            f"or add the file to configs/{GROUP}/")
    return find(f"{name}_{data}")
