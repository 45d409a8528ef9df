"""What the documentation reads off the commands themselves: the module each `python -m` command runs, its short
keys, whether it composes the Hydra run config, its argument dataclasses and its first docstring line
(`vitsinks.pages.options_page` writes them into the options page)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types

from vitsinks.configs import cli
from vitsinks.configs.usage import commands


def command_modules() -> dict[str, types.ModuleType]:
    """`python -m` name -> its module, for every command `python -m vitsinks` lists."""
    return {name: importlib.import_module(name) for name in commands()}


def short_keys(module: types.ModuleType) -> dict[str, str]:
    """The short keys of a Hydra command (`n_images=` for `diagnostics.n_images=`), read from its entry point."""
    for obj in vars(module).values():
        if inspect.isfunction(obj) and obj.__closure__:
            free = inspect.getclosurevars(obj).nonlocals
            if "fn" in free and "aliases" in free:
                return dict(free["aliases"] or {})
    return {}


def describe_short_keys(keys: dict[str, str]) -> str:
    """`n_images=` for `diagnostics.n_images=`, ...: one prefix said once where every key shares it."""
    prefixes = {v.rsplit(".", 1)[0] for v in keys.values() if "." in v}
    if len(prefixes) == 1 and all(v == f"{next(iter(prefixes))}.{k}" for k, v in keys.items()):
        return ", ".join(f"`{k}=`" for k in keys) + f" (each for `{next(iter(prefixes))}.<key>=`)"
    return ", ".join(f"`{k}=` (`{v}=`)" for k, v in keys.items())


def is_hydra(module: types.ModuleType) -> bool:
    """Whether the command composes the Hydra run config (its module uses `cli.hydra_command`)."""
    return getattr(module, "hydra_command", None) is cli.hydra_command


def argument_classes(module: types.ModuleType) -> list[type]:
    """A plain command's argument dataclasses: those its module defines whose name ends in `Args`."""
    return [obj for name, obj in vars(module).items() if name.endswith("Args") and isinstance(obj, type)
            and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__]


def first_line(module: types.ModuleType) -> str:
    """The first line of a command's docstring."""
    doc = module.__doc__ or ""
    lines = [ln.strip() for ln in doc.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""
