"""The block-mitigation registry: one module per mitigation in this package, found and imported automatically.

A mitigation is a `BlockMitigation` subclass registered with `@register_mitigation`. It declares

- its config: one field `model.<name>` of `ModelConfig` (`config_field`: an enum, or a dataclass of settings);
- its tag in variant names (`tag`, placed by `tag_rank`);
- the module it adds to every block (`build`), stored at `attr` of the attention (`site="heads"`: a gate on the
  per-head outputs before the output projection, `values(z)` broadcastable to (B, N, heads, head_dim)) or of the
  block (`site="update"`: `add_to(o, z)` adds to the attention update o, inside the same residual branch);
- its diagnostics fields (`diagnostics`, `diagnostic_fields`) and its leaderboard columns (`columns`, with
  `leaderboard_values` computing them from a diagnostics summary).

`ModelConfig`, `build_vit`, `SinkBlock`, `checkpoint.ARCH_KEYS`, the variant names and the leaderboard's columns
(`mitigation_columns`) derive from the registry, so a new mitigation is one module here plus its exp config.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from vitsinks.utils.results import Column

Site = Literal["heads", "update"]


class BlockMitigation:
    """A switch of `ModelConfig` that adds a module to every block (see the package docstring)."""

    name: ClassVar[str]  # the config field, model.<name>
    site: ClassVar[Site]
    attr: ClassVar[str]  # attribute of the attention (heads) or block (update): its state-dict prefix
    tag_rank: ClassVar[int]  # order of the tags in a variant name (registers: `REGISTERS_RANK`)
    columns: ClassVar[tuple[Column, ...]] = ()
    diagnostic_fields: ClassVar[dict[str, float]] = {}  # field -> its value in a block without the mitigation
    always_diagnosed: ClassVar[bool] = False  # its fields are in every diagnosis (else only where a block has it)

    @classmethod
    def config_field(cls) -> tuple[Any, dataclasses.Field]:
        """(type, dataclasses.field(...)) of `model.<name>`; the default is the mitigation switched off."""
        raise NotImplementedError

    @classmethod
    def setting(cls, value: Any) -> Any:
        """The canonical setting from a config value, a plain mapping or a keyword argument; None when off."""
        raise NotImplementedError

    @classmethod
    def tag(cls, setting: Any) -> str | None:
        """The variant-name tag of a canonical setting (None: no tag)."""
        raise NotImplementedError

    @classmethod
    def arch(cls, value: Any) -> Any:
        """What two configs must share for a checkpoint to fit (plain data; an off switch's details do not
        matter)."""
        raise NotImplementedError

    @classmethod
    def build(cls, setting: Any, dim: int, num_heads: int) -> nn.Module:
        """The module for one block of width `dim` with `num_heads` heads (the setting is not None)."""
        raise NotImplementedError

    @classmethod
    def diagnostics(cls, block: nn.Module, z: torch.Tensor, it: Any,
                    attn_energy: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """Its fields of one block (per image (B,) or per head (B, heads)) from the pre-normed input z, the
        attention internals `it` and the attention update's mean square per image; None where the block lacks
        it."""
        return None

    @classmethod
    def present(cls, block: nn.Module) -> bool:
        """Whether `block` has this mitigation's module."""
        return getattr(block.attn if cls.site == "heads" else block, cls.attr, None) is not None

    @classmethod
    def leaderboard_values(cls, summary: Mapping[str, Any]) -> dict[str, float]:
        """Its leaderboard columns' values from a diagnostics summary (missing: not in the dict)."""
        return {}


MITIGATIONS: dict[str, type[BlockMitigation]] = {}


def register_mitigation(cls: type[BlockMitigation]) -> type[BlockMitigation]:
    """Class decorator: add a block mitigation to the registry under `cls.name`."""
    if cls.name in MITIGATIONS:
        raise ValueError(f"block mitigation {cls.name!r} is registered twice")
    if cls.site not in ("heads", "update"):
        raise ValueError(f"mitigation {cls.name!r}: site must be 'heads' or 'update', not {cls.site!r}")
    MITIGATIONS[cls.name] = cls
    return cls


def mitigation_columns() -> list[Column]:
    """Every registered mitigation's leaderboard columns, in registry order."""
    return [c for m in MITIGATIONS.values() for c in m.columns]


def mitigation_fields() -> list[tuple[str, Any, dataclasses.Field]]:
    """The `ModelConfig` fields of the mitigations, for `dataclasses.make_dataclass`."""
    return [(m.name, *m.config_field()) for m in MITIGATIONS.values()]


def settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Canonical setting of every mitigation from a mapping of config values (absent: the schema default)."""
    out = {}
    for name, m in MITIGATIONS.items():
        if name in values:
            out[name] = m.setting(values[name])
        else:
            _, f = m.config_field()
            out[name] = m.setting(f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
    return out


def at_site(site: Site) -> tuple[type[BlockMitigation], ...]:
    """The mitigations acting at `site`, in registry order."""
    return tuple(m for m in MITIGATIONS.values() if m.site == site)


for _info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
    importlib.import_module(f"{__name__}.{_info.name}")
