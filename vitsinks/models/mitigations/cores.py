"""Core-periphery attention (VECA: Song et al. 2026, "Elastic Attention Cores for Scalable Vision Transformers",
arXiv 2605.12491): patches never attend to each other; they exchange information only through `n` learned core
tokens. In every block

    cores and [CLS] attend to: [CLS], the cores, the patches (everything)
    patches attend to:         [CLS] and the cores only (not to other patches, not to themselves)

as the authors' code does it (queries of the periphery see the cores' keys only). The cores are learned tokens the
model places after [CLS] in the register slots of the key layout ([CLS] | cores | patches | extra key slots), carried
through the blocks like any token, initialised normal with std width**-0.5 (the authors' `randn / sqrt(dim)`), with no
position embedding (unless `model.register_pos_embed`). The paper has no [CLS]: its first core is the global
representation; here [CLS] plays that core, so the paper's C is `n + 1`. Extra key slots (an attention bias, a kind's
null key) carry no token's information and stay visible to every query. Left out: the paper's learned RoPE
coordinates of the cores and its nested dropout over the core axis (elastic inference). Config: `model.cores.n` (0:
off); registers and cores do not stack (`model.registers` must be 0). The mask makes the forward take the explicit
kernel (the kinds' fused paths take no mask). State dict: `attn.cores.count`, the core count, so that a checkpoint
says it has them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from vitsinks.models.mitigations.mitigation import MITIGATIONS, BlockMitigation
from vitsinks.utils.bounded import bounded
from vitsinks.utils.errors import BadValue

DEFAULT_CORES = 4  # the exp's count (exp=reg's four registers: the same tokens, only the mask differs); tag `cores`


@dataclass(unsafe_hash=True)  # hashable: the attention class is cached by its settings
class CoresConfig:
    """The VECA core tokens (`model.cores`)."""

    n: int = bounded(0, ge=0)  # learned core tokens after [CLS]; 0: off


class CoreMask(nn.Module):
    """The core-periphery mask of `n` cores: [CLS] and the cores (the hubs, tokens 0..n) see every key; a patch
    sees the hubs and the extra key slots only."""

    def __init__(self, n: int) -> None:
        super().__init__()
        if n < 1:
            raise BadValue(f"model.cores.n must be >= 1 to switch the cores on, got {n}")
        self.n = int(n)
        self.register_buffer("count", torch.tensor(self.n))  # in the state dict: a checkpoint tells it has cores

    def init_weights(self) -> None:
        """Nothing to initialise (the cores themselves are the model's prefix tokens)."""

    def hidden(self, n_queries: int, n_keys: int, device: torch.device) -> torch.Tensor:
        """(n_queries, n_keys): True where a query may not see a key: a patch query on a patch key, itself included
        (tokens are the first n_queries keys; the keys after them are extra slots)."""
        hubs = 1 + self.n
        q = torch.arange(n_queries, device=device)
        k = torch.arange(n_keys, device=device)
        periphery_key = (k >= hubs) & (k < n_queries)
        return (q >= hubs)[:, None] & periphery_key[None, :]


@MITIGATIONS.register
class CoresMitigation(BlockMitigation):
    name = "cores"
    site = "mask"
    attr = "cores"
    example = {"n": DEFAULT_CORES}
    # dropping the cores would put patches where the mask expects cores: the cores model has no run without them
    refused_edits = ("drop_registers",)

    @classmethod
    def config_field(cls) -> tuple[Any, dataclasses.Field]:
        return CoresConfig, cast(dataclasses.Field, dataclasses.field(default_factory=CoresConfig))

    @classmethod
    def setting(cls, value: Any) -> CoresConfig | None:
        """A `CoresConfig`, a mapping `{"n": ...}` or the count itself; None (off) for None, False or 0 cores."""
        if value is None or value is False:
            return None
        if isinstance(value, CoresConfig):
            n: Any = value.n
        elif isinstance(value, Mapping) or hasattr(value, "items"):
            unknown = set(value.keys()) - {"n"}
            if unknown:
                raise BadValue(f"unknown cores settings {sorted(unknown)}; model.cores has only n (the core count)")
            n = value.get("n", 0)
        else:
            n = value
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise BadValue(f"model.cores.n must be a whole number >= 0 (0: no cores), got {n!r}")
        return CoresConfig(n) if n else None

    @classmethod
    def tag(cls, setting: CoresConfig | None) -> str | None:
        if setting is None:
            return None
        return "cores" if setting.n == DEFAULT_CORES else f"cores{setting.n}"

    @classmethod
    def arch(cls, value: Any) -> dict[str, int]:
        s = cls.setting(value)
        return {"n": 0 if s is None else s.n}

    @classmethod
    def build(cls, setting: CoresConfig, dim: int, num_heads: int) -> CoreMask:
        return CoreMask(setting.n)

    @classmethod
    def prefix_tokens(cls, setting: CoresConfig | None) -> int:
        return 0 if setting is None else setting.n

    @classmethod
    def init_prefix(cls, tokens: torch.Tensor) -> None:
        """Normal with std width**-0.5 (the authors' `randn(1, C, dim) / sqrt(dim)`)."""
        nn.init.normal_(tokens, std=tokens.shape[-1] ** -0.5)
