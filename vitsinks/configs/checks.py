"""What a composed config must satisfy beyond its types (`check_config`): every numeric field in the range it declares
(`bounded`), the open sets' values registered, and sizes and settings that fit together."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.user_inputs import name_problem
from vitsinks.models.kinds import KINDS
from vitsinks.models.vit import SIZES
from vitsinks.utils.bounded import Range, range_of
from vitsinks.utils.errors import BadValue, ConfigError
from vitsinks.utils.registry import FIELDS, import_plugins


@dataclass(frozen=True)
class NumericField:
    """One int / float field of the schema (or a list of them: `is_list`), its dotted key and declared range."""

    key: str
    owner: type
    name: str
    kind: type  # int or float
    is_list: bool
    range: Range | None


def unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """(`X`, True) for the type hint `X | None`, else (`hint`, False)."""
    args = typing.get_args(hint)
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    if union and len(args) == 2 and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def numeric_fields(schema: type, prefix: str = "") -> Iterator[NumericField]:
    """Every numeric field (`int`, `float | None`, `list[float]`, ...) of the config dataclass `schema`, nested
    dataclasses included."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        key, inner = f"{prefix}{f.name}", unwrap_optional(hints[f.name])[0]
        args = typing.get_args(inner)
        kind, is_list = (args[0], True) if typing.get_origin(inner) is list and len(args) == 1 else (inner, False)
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            yield from numeric_fields(inner, key + ".")
        elif kind in (int, float):
            yield NumericField(key, schema, f.name, kind, is_list, range_of(f))


def check_config(cfg: DictConfig) -> None:
    """A `ConfigError` naming each field, its value and what is allowed, for: a number outside the range its field
    declares (None means "the default": not checked), a value of an open set (`Registry.fields`: `data.name`, ...)
    that its registry lacks (after importing the modules of `plugins`), and sizes or settings that do not fit
    together. The closed sets are enums, checked by OmegaConf at composition."""
    import_plugins(cfg.get("plugins") or [])
    problems = [reg.unknown(value, key) for key, reg in FIELDS.items()
                if (value := OmegaConf.select(cfg, key, default=None)) is not None and str(value) not in reg]
    for nf in numeric_fields(cast(type, OmegaConf.get_type(cfg))):  # the schema it was composed on (`schema.Config`)
        value = OmegaConf.select(cfg, nf.key, default=None)
        if value is not None and nf.range is not None and (problem := nf.range.problem(nf.key, value, nf.is_list)):
            problems.append(problem)
    m = cfg.model
    if m.size not in SIZES:
        problems.append(f"model.size={m.size} (choose one of {', '.join(sorted(SIZES))})")
    else:
        spec = SIZES[m.size]
        img, patch = m.img_size or spec.img_size, m.patch_size or spec.patch_size
        dim, heads = m.embed_dim or spec.embed_dim, m.num_heads or spec.num_heads
        if img > 0 and patch > 0 and img % patch:
            problems.append(f"model.img_size={img} is not a multiple of model.patch_size={patch}")
        if dim > 0 and heads > 0 and dim % heads:
            problems.append(f"model.embed_dim={dim} is not divisible by model.num_heads={heads}")
    if str(m.attn) in KINDS:
        try:
            KINDS[str(m.attn)].settings(m.get("kind_settings"))
        except BadValue as err:
            problems.append(str(err))
    if cfg.get("imported"):
        problems.append(f"imported={cfg.imported} (set by vitsinks on the run it imports a pretrained model as: pass "
                        f"model.pretrained=<timm name or weights file>)")
    st = cfg.intervene
    if st.shard is not None and st.nshards is not None and st.shard >= st.nshards:
        problems.append(f"intervene.shard={st.shard} (must be < intervene.nshards={st.nshards})")
    if cfg.views.style == "kempner" and cfg.views.backend == "device":
        problems.append("views.style=kempner with views.backend=device (the device path has the dino style only: set "
                        "views.backend=cpu, or views.style=dino)")
    problems += [p for p in [name_problem(cfg)] if p]  # before anything runs: a folder the file system can hold
    if problems:
        raise ConfigError("invalid setting" + ("s" if len(problems) > 1 else "") + ": " + "; ".join(problems))
