"""The pages made from the code (`python -m vitsinks.docs`; tests/pages compare the committed ones).

docs/commands-options.md (`render`): the commands, their arguments, the config groups and every field of the schema,
naming the block mitigations and attention kinds it covers (`Plugins`, so that one added since leaves the committed
page current); and the variant blocks of README.md and docs/variants.md (`write_variants`).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import pkgutil
import re
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Collection, Iterator, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.checks import unwrap_optional
from vitsinks.configs.schema import Config, compose_config, config_dir
from vitsinks.configs.search import checkout_configs, options, yaml_description
from vitsinks.configs.usage import Source, commands
from vitsinks.configs.variants import STUDY_VARIANTS, variant_order
from vitsinks.data import DATASETS  # noqa: F401 - the registries whose names are the choices of open sets
from vitsinks.models.kinds import KINDS
from vitsinks.models.mitigations import MITIGATIONS
from vitsinks.models.vit import SIZES
from vitsinks.objectives import OBJECTIVES  # noqa: F401
from vitsinks.probes.dense_protocols import DENSE_PROTOCOLS  # noqa: F401
from vitsinks.probes.knn_protocols import KNN_PROTOCOLS  # noqa: F401
from vitsinks.probes.linear_protocols import LINEAR_PROTOCOLS  # noqa: F401
from vitsinks.utils import files
from vitsinks.utils.bounded import range_of
from vitsinks.utils.errors import BadValue
from vitsinks.utils.registry import FIELDS
from vitsinks.utils.tables import markdown_table

GENERATOR = "python -m vitsinks.docs > docs/commands-options.md"
ATTN_KEY = "model.attn"  # the field whose choices are the attention kinds (`vitsinks.models.kinds`)
COVERS = ("Covers the block mitigations (`model.<name>`): {mitigations}; and the attention kinds (`{attn}`): "
          "{kinds}. A mitigation or attention kind added since is on this page once it is generated again.")
COVERS_RE = re.compile(r"^Covers the block mitigations \(`model\.<name>`\): (.*?); and the attention kinds "
                       r"\(`model\.attn`\): (.*?)\. A mitigation", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Plugins:
    """The block mitigations (`model.<name>` fields) and attention kinds (`model.attn` choices) a page covers; one
    registered but not covered is left out, with the config files that switch it on."""

    mitigations: tuple[str, ...]
    kinds: tuple[str, ...]

    @classmethod
    def registered(cls) -> Plugins:
        """Every registered mitigation and kind: what the generator covers."""
        return cls(tuple(sorted(MITIGATIONS)), tuple(sorted(KINDS)))

    @classmethod
    def of_page(cls, page: str) -> Plugins | None:
        """The plugins a generated page says it covers (its `COVERS` line); None without the line."""
        found = COVERS_RE.search(page)
        return None if found is None else cls(*(tuple(re.findall(r"`([^`]+)`", n)) for n in found.groups()))

    def line(self) -> str:
        """The page's line naming them."""
        return COVERS.format(attn=ATTN_KEY, **{k: ", ".join(f"`{n}`" for n in v) or "none"
                                               for k, v in dataclasses.asdict(self).items()})

    def known(self) -> Plugins:
        """Those of them still registered (a page naming a removed one is stale)."""
        return Plugins(tuple(m for m in self.mitigations if m in MITIGATIONS),
                       tuple(k for k in self.kinds if k in KINDS))

    def left_out(self) -> tuple[set[str], set[str]]:
        """(the registered mitigations, the registered kinds) not covered."""
        return set(MITIGATIONS) - set(self.mitigations), set(KINDS) - set(self.kinds)

    def leaves_out(self, key: str) -> bool:
        """Whether config key `key` is (under) the field of a mitigation not covered."""
        return any(key == f"model.{m}" or key.startswith(f"model.{m}.") for m in self.left_out()[0])

    def switches_on_left_out(self, text: str) -> bool:
        """Whether a config file's `text` (`@package _global_`: an exp config) switches on a mitigation or sets an
        attention kind not covered: the plugin's own exp config, left out with it."""
        if "@package _global_" not in text:
            return False
        mitigations, kinds = self.left_out()
        model = cast(DictConfig, OmegaConf.create(text)).get("model") or {}  # a config file: a mapping
        return str(model.get("attn")) in kinds or any(
            m in model and MITIGATIONS[m].setting(model[m]) is not None for m in mitigations)


VARIANTS_GENERATOR = "python -m vitsinks.docs variants"
REPOSITORY = Path(__file__).resolve().parents[2]  # the checkout whose pages `variants` rewrites
VARIANT_PAGES = ("README.md", "docs/variants.md")  # the list, the table
START, END = "<!-- variants:start -->", "<!-- variants:end -->"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table whose cells are one line each."""
    return markdown_table(header, [[" ".join(str(c).split()) for c in row] for row in rows])


def describe_short_keys(keys: dict[str, str]) -> str:
    """`n_images=` for `diagnostics.n_images=`, ...: one prefix said once where every key shares it."""
    prefixes = {v.rsplit(".", 1)[0] for v in keys.values() if "." in v}
    if len(prefixes) == 1 and all(v == f"{next(iter(prefixes))}.{k}" for k, v in keys.items()):
        return ", ".join(f"`{k}=`" for k in keys) + f" (each for `{next(iter(prefixes))}.<key>=`)"
    return ", ".join(f"`{k}=` (`{v}=`)" for k, v in keys.items())


def argument_classes(module: types.ModuleType) -> list[type]:
    """A plain command's argument dataclasses: those its module defines whose name ends in `Args`."""
    return [obj for name, obj in vars(module).items() if name.endswith("Args") and isinstance(obj, type)
            and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__]


def _source_comments(source: str) -> dict[str, str]:
    """Field name -> the comment lines right above it and the comment at the end of its last line in `source`; fields
    are `name: type = ...` lines and `make_dataclass`'s `("name", type, field)` tuples."""
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    fields: list[tuple[str, int, int]] = []  # a name may appear twice (a type checker's stub without comments)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            fields.append((node.target.id, node.lineno, node.end_lineno or node.lineno))
        elif (isinstance(node, ast.Tuple) and node.elts and isinstance(node.elts[0], ast.Constant)
              and isinstance(node.elts[0].value, str) and len(node.elts) == 3):
            fields.append((node.elts[0].value, node.lineno, node.end_lineno or node.lineno))
    out: dict[str, str] = {}
    for name, first, last in fields:
        if name in out:
            continue
        above: list[str] = []
        row = first - 1
        while row >= 1 and lines[row - 1].strip().startswith("#") and row in comments:
            above.insert(0, comments[row])
            row -= 1
        if text := " ".join([*above, *([comments[last]] if last in comments else [])]):
            out[name] = text
    return out


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment beside it in the source of `cls` and of its dataclass bases; the fields that
    `make_dataclass` added are looked up in the module that made the class."""
    out: dict[str, str] = {}
    for klass in filter(dataclasses.is_dataclass, reversed(cls.__mro__)):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # made by make_dataclass: no class statement
            source = ""
        found = _source_comments(source) if source else {}
        declared = {n.target.id for n in ast.walk(ast.parse(source))
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        if not set(klass.__annotations__) <= declared:  # made by make_dataclass (or a type checker's stub of one)
            module = _source_comments(inspect.getsource(sys.modules[klass.__module__]))
            found = {**{k: v for k, v in module.items() if k in klass.__annotations__}, **found}
        out.update(found)
    return out


def type_name(hint: Any) -> str:
    """`int`, `float | None`, `list[float]`, `dict`, or the enum's name for a closed set."""
    inner, optional = unwrap_optional(hint)
    if isinstance(inner, type) and issubclass(inner, Enum):
        name = "choice"
    elif typing.get_origin(inner) is list:
        name = f"list[{type_name(typing.get_args(inner)[0])}]" if typing.get_args(inner) else "list"
    elif typing.get_origin(inner) is dict:
        name = "dict"
    elif isinstance(inner, type):
        name = inner.__name__
    else:
        name = str(inner)
    return f"{name} | None" if optional else name


def admits(f: dataclasses.Field, hint: Any, hidden: Collection[str] = (), choices: Sequence[str] | None = None) -> str:
    """What a field accepts beyond its type: the closed set's values (but `hidden`), the `choices` of an open set
    (a registry's names), or the declared range ('' when anything of its type goes)."""
    inner, optional = unwrap_optional(hint)
    if choices is not None:
        text = ", ".join(choices)
    elif isinstance(inner, type) and issubclass(inner, Enum):
        text = ", ".join(m.value for m in inner if m.value not in hidden)
    elif (rng := range_of(f)) is not None:
        text = ("each " if typing.get_origin(inner) is list else "") + rng.describe()
    else:
        return ""
    return text + (", or null" if optional else "")


def _default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, list | dict):
        return str(value).replace("'", "")
    return str(value)


def field_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default, its factory's value for a mutable one (None when it has neither)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def sections(cls: type = Config, key: str = "") -> Iterator[tuple[str, type]]:
    """(dotted key, class) of every config dataclass of the schema: the top level ('') first, nested ones after their
    parent."""
    yield key, cls
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        inner, _ = unwrap_optional(hints[f.name])
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            yield from sections(inner, f"{key}.{f.name}" if key else f.name)


def field_rows(section: str, cls: type, defaults: Any, plugins: Plugins | None = None) -> list[list[str]]:
    """The table rows (key, type, default, admits, meaning) of the own (non-nested) fields of the config dataclass
    `cls` at key `section`; with `plugins`, only the mitigations' fields and attention kinds it covers."""
    plugins = plugins or Plugins.registered()
    hints = typing.get_type_hints(cls)
    notes = field_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(unwrap_optional(hint)[0]):
            continue
        key = f"{section}.{f.name}" if section else f.name
        if plugins.leaves_out(key):
            continue
        value = OmegaConf.select(defaults, key, default=None, throw_on_missing=False)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=False)
        hidden = plugins.left_out()[1] if key == ATTN_KEY else ()
        registry = FIELDS.get(key)  # an open set: its registered names are the choices
        kind = type_name(hint).replace("str", "choice", 1) if registry else type_name(hint)
        rows.append([f"`{key}`", kind, f"`{_default(value)}`",
                     admits(f, hint, hidden, registry.names() if registry else None), notes.get(f.name, "")])
    return rows


def _doc_paragraph(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _flatten(tree: Any, prefix: str) -> list[str]:
    if isinstance(tree, dict):
        return [item for k, v in tree.items() for item in _flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    return [f"{prefix}={_default(tree)}"]


SETTINGS_SHOWN = ("exp", "model", "study")  # the groups whose table also lists every value the option sets


def group_options(plugins: Plugins | None = None) -> list[tuple[str, list[list[str]]]]:
    """Per config group, rows (option, what it is[, the values it sets]) of every YAML option of the package's and
    the checkout's `configs/` (marked), so that the page is the same on every machine."""
    out = []
    committed = [d for d in (checkout_configs(), config_dir()) if d is not None]
    for group, found in options(committed).items():
        rows = []
        for stem, yml in sorted(found.items(), key=lambda item: item[1].name):  # the files' order
            text = yml.read_text()
            if plugins is not None and plugins.switches_on_left_out(text):  # a plugin the page does not cover
                continue
            where = "" if yml.is_relative_to(config_dir()) else " (configs/)"
            row = [f"`{group}={stem}`{where}", yaml_description(text)]
            if group in SETTINGS_SHOWN:
                tree = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.load(yml), resolve=False))  # a mapping
                tree = {k: v for k, v in tree.items() if k not in ("defaults", "exp")}
                if group == "study":
                    tree = tree.get("hydra", {}).get("sweeper", {}).get("params", {})
                prefix = "" if "@package _global_" in text else group
                row.append(", ".join(f"`{s}`" for s in _flatten(tree, prefix)))
            rows.append(row)
        out.append((group, rows))
    return out


def render(plugins: Plugins | None = None) -> str:
    """The whole page, covering `plugins` (default: every registered mitigation and attention kind)."""
    plugins = plugins or Plugins.registered()
    out = ["# Options of every command", "",
           f"Generated from the code by `{GENERATOR}`; do not edit by hand "
           "(`tests/pages/test_options_page.py` fails when this page and the code differ). [commands.md](commands.md) "
           "explains each command, its outputs and exit codes; this page lists what they accept.", "",
           plugins.line(), ""]
    mods = {name: importlib.import_module(name) for name in commands()}
    rows = []
    for name, what in commands().items():
        src = Source.of(name)
        kind = ("run config (`key=value`, `group=option`)" if src.is_hydra
                else "own arguments (`key=value`)" if argument_classes(mods[name]) else "nothing")
        rows.append([f"`python -m {name}`", what, kind, describe_short_keys(src.aliases())])
    out += ["## Commands", "", *_table(["command", "what", "takes", "short keys"], rows), ""]
    out += ["Every command that takes the run config accepts any field below as `key=value` and any option of a "
            "config group as `group=option`; `--cfg job` prints the composed config, `--help` the groups.", ""]
    parts = {f"{name} {info.name}": importlib.import_module(f"{mod.PARTS}.{info.name}")  # a command's parts
             for name, mod in mods.items() if hasattr(mod, "PARTS")
             for info in pkgutil.iter_modules(importlib.import_module(mod.PARTS).__path__)}
    for name, mod in {**mods, **parts}.items():
        for cls in argument_classes(mod):
            hints = typing.get_type_hints(cls)
            notes = field_comments(cls)
            rows = [[f"`{f.name}`", type_name(hints[f.name]), f"`{_default(field_default(f))}`", notes.get(f.name, "")]
                    for f in dataclasses.fields(cls)]
            out += [f"### Arguments of `{name}`", "", *_table(["key", "type", "default", "meaning"], rows), ""]
    picked = [f"`{k}={v}`" for d in OmegaConf.load(config_dir() / "config.yaml").defaults if OmegaConf.is_dict(d)
              for k, v in d.items() if v is not None and " " not in k]
    out += ["## Config groups", "", "Pick one option per group on the command line (`exp=gate+reg model=vit_small`); "
            f"`config.yaml` picks the defaults ({', '.join(picked)}). An option marked (configs/) is a file of the "
            "checkout's `configs/`, what a user edits ([README](../README.md#configs)); a user's own folders add "
            "theirs (`--help` lists them).", ""]
    for group, rows in group_options(plugins):
        header = ["option", "what it is", *(["sets"] if group in SETTINGS_SHOWN else [])]
        out += [f"### `{group}=` options", "", *_table(header, rows), ""]
        if group == "model":
            sizes = [[f"`{name}`", *(str(getattr(spec, k)) for k in ("img_size", "patch_size", "embed_dim", "depth",
                                                                     "num_heads"))] for name, spec in SIZES.items()]
            out += ["The sizes (`model.size`; `model.img_size`, `patch_size`, `embed_dim`, `depth`, `num_heads` "
                    "override them one by one):", "",
                    *_table(["size", "image", "patch", "width", "depth", "heads"], sizes), ""]
    defaults = compose_config([])
    out += ["## Fields", "", "Defaults are those of the composed config with no overrides (the dataclass default, or "
            "the group's default YAML where it sets the field). A number outside its range, or a value outside its "
            "closed set, stops the command before anything runs.", ""]
    for section, cls in sections():
        rows = [] if plugins.leaves_out(section) else field_rows(section, cls, defaults, plugins)
        if not rows:
            continue
        title = f"`{section}.*` fields" if section else "Top-level fields"
        out += [f"### {title}", "", _doc_paragraph(cls), "",
                *_table(["key", "type", "default", "admits", "meaning"], rows), ""]
    return "\n".join(out).rstrip() + "\n"


def current(page: str) -> str:
    """`page` as the code writes it for the plugins it says it covers (`Plugins.of_page`; all without the line), so
    that a mitigation or attention kind added since does not make it stale, and any other change does."""
    said = Plugins.of_page(page)
    return render(None if said is None else said.known())


def _arch_text(arch: Any) -> str:
    """A mitigation's `arch` value in a table cell: `elementwise`, or `(state_dim 64, gate hier, ...)`."""
    if isinstance(arch, Mapping):
        return "(" + ", ".join(f"{k} {_default(v)}" for k, v in arch.items() if k != "enabled") + ")"
    return "" if arch is True else _default(arch)


def variant_rows(order: Sequence[str] | None = None) -> list[list[str]]:
    """One row per variant (`order`, default `variant_order`): attention kind, registers, the block mitigations it
    switches on, common-mode penalty and the first comment of its exp file."""
    rows = []
    for exp in variant_order() if order is None else order:
        cfg = compose_config([f"exp={exp}"])
        m, objective = cfg.model, cfg.objective
        on = [f"{name} {_arch_text(mit.arch(m[name]))}".strip() for name, mit in MITIGATIONS.items()
              if mit.setting(m[name]) is not None]
        penalty = f"{objective.cm_penalty:g}" + (", before the gate" if objective.cm_pre_gate else "")
        path = config_dir() / "exp" / f"{exp}.yaml"
        rows.append([f"`{exp}`", f"`{_default(m.attn)}`", str(m.registers), "; ".join(on) or "-",
                     penalty if objective.cm_penalty else "-", yaml_description(path.read_text())])
    return rows


def render_variants(only: Collection[str] | None = None) -> dict[str, str]:
    """The generated block of each page of `VARIANT_PAGES` (README.md's list, docs/variants.md's table); with `only`,
    for those variants alone (`listed_variants`)."""
    order = [v for v in variant_order() if only is None or v in only]
    study = [f"`{v}`" for v in order if v in STUDY_VARIANTS]
    listed = ([", ".join(study) + " (the study's variants)"] if study else []) + [f"`{v}`" for v in order[len(study):]]
    readme = textwrap.fill(f"{', '.join(listed)}: one `exp=<name>` each, the file `vitsinks/configs/exp/<name>.yaml`.",
                           width=116, break_long_words=False, break_on_hyphens=False)
    header = ["variant (`exp=`)", "attention (`model.attn`)", "registers", "block mitigations (`model.<name>`)",
              "common-mode penalty", "what it is (the file's first comment)"]
    table = "\n".join(_table(header, variant_rows(order)))
    note = f"Generated by `{VARIANTS_GENERATOR}` from `vitsinks/configs/exp/`; do not edit by hand."
    return {"README.md": readme, "docs/variants.md": f"{table}\n\n{note}"}


def listed_variants(table_page: str) -> list[str]:
    """The variants a committed docs/variants.md table lists (the first cell of its generated rows)."""
    block = table_page.split(START, 1)[1].split(END, 1)[0] if START in table_page else ""
    return [line.split("`")[1] for line in block.splitlines() if line.startswith("| `")]


def replace_block(text: str, block: str, where: str) -> str:
    """`text` with what lies between its `START` and `END` lines replaced by `block` (`where`: for the error)."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise BadValue(f"{where} needs one {START} line and, after it, one {END} line")
    head, rest = text.split(START)
    return f"{head}{START}\n{block}\n{END}{rest.split(END, 1)[1]}"


def write_variants(root: Path = REPOSITORY) -> list[Path]:
    """Rewrite the generated blocks of `VARIANT_PAGES` under `root` (`render_variants`); returns the pages changed."""
    changed = []
    for page, block in render_variants().items():
        path = root / page
        text = path.read_text()
        new = replace_block(text, block, page)
        if new != text:
            files.write_text(path, new)
            changed.append(path)
    return changed
