"""The block mitigation's interface (`BlockMitigation`, `SwitchMitigation`), its registry (`MITIGATIONS`) and what
derives from it. A mitigation declares its config field, variant tag, the module it adds to every block by `site`
(`heads`: a gate on the per-head outputs; `keys`: extra keys every query can attend to, the key layout's slots
`slots`; `outputs`: a module mapping the per-head outputs (B, heads, N, head_dim) to new ones between A v and the
output projection, before the gate; `mask`: a module whose `hidden(n_queries, n_keys, device)` marks keys queries may
not see; `update`: an addition to the attention update), any learned tokens of its own in the register slots
(`prefix_tokens`), its diagnostics, leaderboard columns and interventions, and an `example` setting for the generic
tests: docs/extending.md, "A new block mitigation".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

import numpy as np
import torch
from torch import nn

from vitsinks.models.layout import KeyLayout
from vitsinks.utils.columns import Column
from vitsinks.utils.errors import BadValue
from vitsinks.utils.registry import Registry

if TYPE_CHECKING:  # annotations only: the attention module imports the mitigations
    from vitsinks.models.attention import AttnInternals
    from vitsinks.models.seam import Block

Site = Literal["heads", "keys", "outputs", "mask", "update"]
SITES: tuple[str, ...] = ("heads", "keys", "outputs", "mask", "update")
SINK_VALUE_EDITS: tuple[str, ...] = ("zero_sink_value", "mean_sink_value", "noise_sink_value", "donor_sink_value",
                                     "shuffle_sink_value", "donor_nonsink_value")  # edit the value at the sink


class BlockMitigation:
    """A switch of `ModelConfig` that adds a module to every block (see the package docstring)."""

    name: ClassVar[str]  # the config field, model.<name>
    site: ClassVar[Site]
    attr: ClassVar[str]  # attribute of the attention (every site but update) or block (update): its state-dict prefix
    columns: ClassVar[tuple[Column, ...]] = ()
    diagnostic_fields: ClassVar[dict[str, float]] = {}  # field -> its value in a block without the mitigation
    always_diagnosed: ClassVar[bool] = False  # its fields are in every diagnosis (else only where a block has it)
    slots: ClassVar[tuple[str, ...]] = ()  # keys site: the names of the extra key slots it appends
    slot_edits: ClassVar[tuple[str, ...]] = SINK_VALUE_EDITS  # keys site: the value edits of a sink on its slots
    edits: ClassVar[tuple[str, ...]] = ()  # the interventions it brings (applied by `edit`)
    refused_edits: ClassVar[tuple[str, ...]] = ()  # interventions that mean nothing on a model with it (refused)
    example: ClassVar[Any] = None  # a config value that switches it on (the generic tests use it)
    hub_tag: ClassVar[str] = ""  # the Hugging Face hub tag of a model with it (empty: its name, hyphenated)

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
        """What two configs must share for a checkpoint to fit (plain data)."""
        raise NotImplementedError

    @classmethod
    def build(cls, setting: Any, dim: int, num_heads: int) -> nn.Module:
        """The module for one block of width `dim` with `num_heads` heads (the setting is not None)."""
        raise NotImplementedError

    @classmethod
    def prefix_tokens(cls, setting: Any) -> int:
        """Learned tokens the model adds for it after [CLS], in the register slots of the key layout (0: none; such a
        mitigation takes those slots: `model.registers` must be 0)."""
        return 0

    @classmethod
    def init_prefix(cls, tokens: torch.Tensor) -> None:
        """Initialise its prefix tokens (1, n, dim) in place (unless `model.prefix_init_std` sets them)."""

    @classmethod
    def diagnostics(cls, block: Block, z: torch.Tensor, it: AttnInternals,
                    attn_energy: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """Its fields of one block (per image (B,) or per head (B, heads)) from the pre-normed input z, the attention
        internals `it` and the attention update's mean square per image; None where the block lacks it."""
        return None

    @classmethod
    def present(cls, block: Block) -> bool:
        """Whether `block` has this mitigation's module."""
        return getattr(block.attn if cls.site != "update" else block, cls.attr, None) is not None

    @classmethod
    def summarise(cls, d: Mapping[str, np.ndarray], layout: KeyLayout) -> dict[str, Any]:
        """Its part of a diagnostics summary from the per-image fields `d` (images, blocks[, heads]): by default
        `<field>_by_block`, each field's mean per block (None where no block has it)."""
        out: dict[str, Any] = {}
        for k in cls.diagnostic_fields:
            if k in d and not np.isnan(d[k]).all():
                per_block = d[k].mean(axis=0) if d[k].ndim == 2 else d[k].mean(axis=(0, 2))
                out[f"{k}_by_block"] = [None if np.isnan(x) else float(np.round(x, 6)) for x in per_block]
        return out

    @classmethod
    def leaderboard_values(cls, summary: Mapping[str, Any]) -> dict[str, float]:
        """Its leaderboard columns' values from a diagnostics summary: by default each column's `<key>_by_block`
        averaged over the blocks that have it (missing: not in the dict)."""
        out = {}
        for c in cls.columns:
            values = [v for v in summary.get(f"{c.key}_by_block") or [] if v is not None]
            if values:
                out[c.key] = float(np.mean(values))
        return out

    @classmethod
    def edit(cls, name: str, it: AttnInternals, head: int) -> AttnInternals:
        """One of its `edits` applied to head `head` of a block's attention internals `it`: edited copies."""
        raise NotImplementedError(f"{cls.name} brings no edit {name!r}")


class SwitchMitigation(BlockMitigation):
    """A mitigation switched on or off (`model.<name>=true|false`), tagged `tag_name` (default its name)."""

    tag_name: ClassVar[str | None] = None
    example = True

    @classmethod
    def config_field(cls) -> tuple[Any, dataclasses.Field]:
        # dataclasses.field() is typed as its default, for class bodies
        return bool, cast(dataclasses.Field, dataclasses.field(default=False))

    @classmethod
    def setting(cls, value: Any) -> bool | None:
        if value is None or value is False or value == "false":
            return None
        if value is True or value == "true":
            return True
        raise BadValue(f"model.{cls.name} must be true or false, got {value!r}")

    @classmethod
    def tag(cls, setting: bool | None) -> str | None:
        return None if setting is None else (cls.tag_name or cls.name)

    @classmethod
    def arch(cls, value: Any) -> bool:
        return cls.setting(value) is not None


def _check(cls: type[BlockMitigation]) -> None:
    """Refuse a mitigation whose declaration is incomplete (a `ValueError` naming what is missing)."""
    if cls.site not in SITES:
        raise ValueError(f"mitigation {cls.name!r}: site must be one of {SITES}, not {cls.site!r}")
    if (cls.site == "keys") != bool(cls.slots):
        raise ValueError(f"mitigation {cls.name!r}: a keys-site mitigation names its key slots (`slots`), no other")
    if cls.example is None or cls.setting(cls.example) is None:
        raise ValueError(f"mitigation {cls.name!r}: `example` must be a setting that switches it on")


MITIGATIONS: Registry[type[BlockMitigation]] = Registry(
    "block mitigation", "a `BlockMitigation` registered with `@MITIGATIONS.register` in a module of "
    "vitsinks/models/mitigations/ (docs/extending.md)", check=_check)


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


def at_site(*sites: Site) -> tuple[type[BlockMitigation], ...]:
    """The mitigations acting at any of `sites`, in registry order."""
    return tuple(m for m in MITIGATIONS.values() if m.site in sites)


def brought_edits() -> dict[str, type[BlockMitigation]]:
    """Every edit a mitigation brings -> that mitigation."""
    out: dict[str, type[BlockMitigation]] = {}
    for m in MITIGATIONS.values():
        for e in m.edits:
            if e in out or e in SINK_VALUE_EDITS:
                raise ValueError(f"edit {e!r} of mitigation {m.name!r} is already an edit")
            out[e] = m
    return out


def slot_edits(slot: str) -> tuple[str, ...]:
    """The sink-value edits that apply to a sink on extra key slot `slot`: a keys-site mitigation's `slot_edits`; for
    a kind's null key (value 0 in every image) only `donor_nonsink_value`."""
    for m in at_site("keys"):
        if slot in m.slots:
            return m.slot_edits
    return ("donor_nonsink_value",)
