"""The model's typed config (`ModelConfig`, `model.*` of the run config), its closed sets, and the one variant naming.
The kind enum `Attn` and one field per block mitigation come from the registries; a field's metadata says whether it
shapes the architecture (`arch_keys`, compared on resume) and its allowed range (`vitsinks.utils.bounded`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from vitsinks.models.attention import FUSED_MODES
from vitsinks.models.kinds import ATTN_KINDS, DEFAULT_KIND, KINDS
from vitsinks.models.mitigations import MITIGATIONS, mitigation_fields
from vitsinks.utils.bounded import RANGE, Range

ARCH = "vitsinks.arch"  # field metadata key: False for a field that does not shape the architecture
# The order of the tags in a variant name after the attention kind (unlisted mitigations last, in registry order).
# Committed run names depend on it: the listed ones keep their order.
TAG_ORDER: tuple[str, ...] = ("gate", "registers", "attn_bias", "global_pathway", "qk_norm", "rope")
ARCH_TAGS: dict[str, str] = {"qk_norm": "qknorm", "rope": "rope"}  # architecture switches named in a variant

# Attn and FusedAttention take their members from the registry and FUSED_MODES: a type checker sees no member
Attn = StrEnum("Attn", " ".join(ATTN_KINDS), module=__name__)  # type: ignore[misc]
PatchEmbed = StrEnum("PatchEmbed", "learned orthonormal", module=__name__)
PosEmbed = StrEnum("PosEmbed", "learn none", module=__name__)
FusedAttention = StrEnum("FusedAttention", " ".join(FUSED_MODES), module=__name__)  # type: ignore[misc]


def _field(default: Any, *, arch: bool = True, **bounds: float) -> Any:
    """A dataclass field with its range (`bounds`: ge / gt / le / lt; numbers always finite) and, with `arch=False`,
    the mark that it does not shape the architecture."""
    meta: dict[str, Any] = {RANGE: Range(**bounds)} if bounds or isinstance(default, int | float) else {}
    if not arch:
        meta[ARCH] = False
    return dataclasses.field(default=default, metadata=meta)


@dataclass
class ArchitectureConfig:
    """The fields of `ModelConfig` that every ViT has (the mitigations add theirs)."""

    size: str = "vit_cpu"
    img_size: int | None = _field(None, ge=1)
    patch_size: int | None = _field(None, ge=1)
    embed_dim: int | None = _field(None, ge=1)
    depth: int | None = _field(None, ge=1)
    num_heads: int | None = _field(None, ge=1)
    mlp_ratio: float = _field(4.0, gt=0)
    qkv_bias: bool = True
    proj_bias: bool = True  # attention output-projection bias
    mlp: bool = True  # False: attention-only blocks (the sink tasks)
    patch_embed: PatchEmbed = PatchEmbed.learned  # orthonormal: frozen isometry, no bias (sink tasks)
    pos_embed: PosEmbed = PosEmbed.learn  # learn | none
    layerscale_init: float | None = _field(None, gt=0)  # None: no LayerScale
    norm_eps: float | None = _field(None, gt=0)  # every LayerNorm's eps; None: timm's 1e-6 (the reference's: 1e-5)
    drop_path: float = _field(0.0, arch=False, ge=0, le=0.999)  # stochastic depth (training only)
    registers: int = _field(0, ge=0)
    register_pos_embed: bool = False  # True: the position embedding covers [CLS], registers and patches (reference)
    # [CLS] / register init: None timm's (normal std 1e-6); x: trunc-normal std x. An init: a checkpoint overrides it
    prefix_init_std: float | None = _field(None, arch=False, ge=0)
    attn: Attn = Attn[DEFAULT_KIND]
    # the attention kind's settings by name (its `Settings`; absent ones their defaults): e.g. clipped softmax's gamma
    kind_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    qk_norm: bool = False  # each head's q and k through a LayerNorm of its own (timm's qk_norm; ViT-5's QK-norm)
    rope: bool = False  # 2D RoPE on the patches' q and k, beside the position embedding (ViT-5; models/rope.py)


if TYPE_CHECKING:  # what a type checker sees of the class made from the registry below

    class ModelConfig(ArchitectureConfig):
        pretrained: str | None
        fused_attention: FusedAttention

        def __getattr__(self, name: str) -> Any: ...  # one field per registered block mitigation

else:
    ModelConfig = dataclasses.make_dataclass(
        "ModelConfig",
        [*mitigation_fields(),
         # timm model name (downloads) or a state-dict / checkpoint path
         ("pretrained", str | None, dataclasses.field(default=None, metadata={ARCH: False})),
         # the forward's attention kernel: auto (FlexAttention on CUDA where the kind has it, else SDPA, else
         # explicit) | flex | sdpa | off (always explicit); see models.attention.FUSED_MODES
         ("fused_attention", FusedAttention,
          dataclasses.field(default=FusedAttention["auto"], metadata={ARCH: False}))],
        bases=(ArchitectureConfig,),
    )
ModelConfig.__module__ = __name__  # make_dataclass's own `module=` needs Python 3.12
ModelConfig.__doc__ = ("ViT architecture and sink-mitigation switches (see `vitsinks.models.build_vit`): the fields "
                       "of `ArchitectureConfig` and one field per registered block mitigation.")


def arch_keys() -> tuple[str, ...]:
    """The `ModelConfig` fields that shape the architecture (all but those marked `arch=False`)."""
    return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.metadata.get(ARCH, True))


def config_values(cfg: ArchitectureConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a model config (a `ModelConfig`, a DictConfig or any mapping) as a dict."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, Mapping) or hasattr(cfg, "items"):
        return dict(cfg.items())
    raise TypeError(f"not a model config: {type(cfg).__name__}")


def variant_name(model: ArchitectureConfig | Mapping[str, Any]) -> str:
    """The one name of an architecture, from a model config (or any mapping with its fields): the attention kind
    unless softmax (with its settings that differ from the defaults: `clipped_softmax(gamma=-0.003)`), then the tags
    of registers, mitigations and the `ARCH_TAGS` switches in `TAG_ORDER`: `base`, `gate`, `gate_headwise+reg`,
    `softpick+reg`, `reg+global`, `gate+qknorm+rope`, ..."""
    values = config_values(model)
    attn = str(values.get("attn") or DEFAULT_KIND)
    kind = KINDS[attn] if attn in KINDS else None
    tagged = attn + kind.settings_tag(kind.settings(values.get("kind_settings"))) if kind is not None else attn
    registers = int(values.get("registers") or 0)
    tags: dict[str, str] = {}
    if registers:
        tags["registers"] = "reg" if registers == 4 else f"reg{registers}"
    tags.update({name: tag for name, tag in ARCH_TAGS.items() if values.get(name) is True})
    for name, m in MITIGATIONS.items():
        tag = m.tag(m.setting(values[name])) if name in values else None
        if tag:
            tags[name] = tag
    order = [*TAG_ORDER, *(name for name in MITIGATIONS if name not in TAG_ORDER)]
    parts = ([] if tagged == DEFAULT_KIND else [tagged]) + [tags[name] for name in order if name in tags]
    return "+".join(parts) or "base"


def run_variant(cfg: Mapping[str, Any]) -> str:
    """The variant of a run config (a DictConfig or dict): the architecture's `variant_name`, `+pen` when it trains
    with the common-mode penalty. The leaderboard, `status.json` and the logs name a run by it."""
    objective = cfg.get("objective") or {}
    return variant_name(cfg["model"]) + ("+pen" if objective.get("cm_penalty", 0) else "")
