"""What an intervention needs from a model, for ViTs and for the synthetic tasks' sequence models alike.

A `Subject` is the model seen as: inputs -> tokens entering block 0 (`embed`), a list of `SinkBlock`s, the last
residual stream -> the final tokens the metrics read (`readout`: the final norm of a ViT), how many leading
tokens are not patches (`num_prefix`: [CLS] + registers, or a sequence's BOS), how many of them are [CLS]
(`num_cls`: 1, or 0 for a model without one, whose registers come first), and optionally a classifier on the final
tokens (a checkpoint's online probe or supervised head; a pretrained model's own head, with its own pooling).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitsinks.models import SinkBlock, SinkViT
from vitsinks.models.mitigations import MITIGATIONS
from vitsinks.objectives.lejepa import online_probe
from vitsinks.utils.errors import BadValue


@dataclass
class Subject:
    """A model prepared for interventions (see the module docstring)."""

    blocks: list[SinkBlock]
    embed: Callable[[torch.Tensor], torch.Tensor]
    readout: Callable[[torch.Tensor], torch.Tensor]
    num_prefix: int
    num_registers: int = 0
    causal: bool = False
    classifier: Callable[[torch.Tensor], torch.Tensor] | None = None
    name: str = "model"
    num_cls: int = 1

    def __post_init__(self) -> None:
        if self.num_cls not in (0, 1):
            raise BadValue(f"{self.name}: a model has 0 or 1 [CLS] tokens, not {self.num_cls}")

    @property
    def mitigations(self) -> tuple[str, ...]:
        """The registered block mitigations some block has."""
        return tuple(name for name, m in MITIGATIONS.items() if any(m.present(b) for b in self.blocks))

    @property
    def attn_kinds(self) -> tuple[str, ...]:
        """The attention kinds of the blocks, each once, in block order."""
        return tuple(dict.fromkeys(b.attn.attn_kind for b in self.blocks))

    def heads(self, block: int) -> int:
        return self.blocks[block].attn.num_heads

    def block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Block `index`'s own (fused) forward."""
        blk = self.blocks[index]
        return blk(x, is_causal=True) if self.causal else blk(x)

    def run(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """The residual stream after the last block, from `x` entering block `start`."""
        for i in range(start, len(self.blocks)):
            x = self.block(i, x)
        return x

    def without_registers(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens entering block 0 with the registers (positions C..C+R-1, after the C = `num_cls` [CLS]) removed."""
        c = self.num_cls
        return torch.cat([tokens[:, :c], tokens[:, c + self.num_registers :]], dim=1)


def from_vit(model: SinkViT, head: nn.Module | None = None) -> Subject:
    """A `SinkViT` (eval mode) as a Subject; `head` is a classifier on the final-norm [CLS] (after `fc_norm`)."""
    if model.global_pool != "token":
        raise BadValue(f"interventions read the [CLS] token; this ViT pools with {model.global_pool!r}")
    model.eval()
    classifier = None
    if head is not None:
        head.eval()

        def classifier(final: torch.Tensor) -> torch.Tensor:
            return head(model.fc_norm(final[:, 0]))

    return Subject(list(model.blocks), model.embed_tokens, model.norm, model.num_prefix_tokens,
                   model.num_reg_tokens, classifier=classifier, name=model.variant)


def from_sequence_model(model: Any, num_prefix: int = 0) -> Subject:
    """A `vitsinks.synthetic` sequence model as a Subject: tokens after its embedding, its readout as the final
    tokens, `num_prefix` leading tokens (the BOS of the NOP task) that are not content."""
    model.eval()
    return Subject(list(model.blocks), model.embed, model.head, num_prefix, causal=model.causal,
                   name="sequence model")


def classifier_from_state(state: dict[str, torch.Tensor]) -> nn.Module | None:
    """The linear classifier stored beside a vitsinks backbone: LeJEPA's online probe (`probe.*`) or the
    supervised objective's head (`head.*`); None when the checkpoint has neither."""
    if "probe.1.weight" in state:
        classes, dim = state["probe.1.weight"].shape
        module: nn.Module = online_probe(dim, classes)
        prefix = "probe."
    elif "head.weight" in state:
        classes, dim = state["head.weight"].shape
        module, prefix = nn.Linear(dim, classes), "head."
    else:
        return None
    module.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    return module
