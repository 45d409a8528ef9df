"""Test-time registers (Jiang et al. 2025, docs/trainfree.md): one extra, untrained prefix token, and the register
neurons' activations moved onto it from the patches."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitsinks.configs.schema import TrainFreeConfig
from vitsinks.diagnostics.neurons import find_register_neurons, has_mlp
from vitsinks.models import SinkViT
from vitsinks.trainfree.base import TrainFreeMethod, register_method
from vitsinks.utils.errors import BadValue


def add_register(model: SinkViT) -> int:
    """Append one register to the prefix of `model` ([CLS], its trained registers, then this one), zero and
    without position embedding; `num_reg_tokens` / `num_prefix_tokens` / `reg_token` follow. Returns its index."""
    r, dim = model.num_reg_tokens, model.embed_dim
    ref = model.cls_token
    zero = torch.zeros(1, 1, dim, device=ref.device, dtype=ref.dtype)
    reg = zero if model.reg_token is None else torch.cat([model.reg_token.detach(), zero], dim=1)
    model.reg_token = nn.Parameter(reg)
    if model.pos_embed is not None and model.register_pos_embed:
        # timm's layout (the position embedding covers [CLS] + registers + patches): a zero row, i.e. none
        pe = model.pos_embed.detach()
        model.pos_embed = nn.Parameter(torch.cat([pe[:, : 1 + r], pe.new_zeros(1, 1, dim), pe[:, 1 + r :]], dim=1))
    model.num_reg_tokens = r + 1
    model.num_prefix_tokens += 1
    return model.num_prefix_tokens - 1


ActHook = Callable[[nn.Module, Any, torch.Tensor], torch.Tensor]


def move_to_register(units: list[int], register: int, first_patch: int,
                     tokens: Callable[[], int] | None = None) -> ActHook:
    """A forward hook for `blk.mlp.act`: each of `units` takes at token `register` its maximum over all tokens of
    the image, and 0 at every patch token (from `first_patch` on); [CLS] and trained registers keep theirs.
    `tokens()`: how many tokens the model's embedding made in this forward; a sequence of another length (the
    registers dropped) has its register and patches elsewhere, and is refused."""
    idx = torch.tensor(units, dtype=torch.long)

    def hook(_module: nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
        if tokens is not None and out.shape[1] != (n := tokens()):
            raise BadValue(f"a model with a test-time register cannot run without its registers (its blocks got "
                           f"{out.shape[1]} tokens, its embedding made {n}): the register neurons would be moved into "
                           f"a patch; choose other edits: intervene.edits=[...] without drop_registers")
        i = idx.to(out.device)
        peak = out[:, :, i].amax(dim=1)  # (B, K)
        out = out.clone()
        out[:, first_patch:, i] = 0
        out[:, register, i] = peak
        return out

    return hook


@register_method
class TestTimeRegister(TrainFreeMethod):
    """fit: the top `settings.neurons` register neurons (over all blocks) on the fit images; apply: one more
    register and, in every block with register neurons, their activations moved onto it (`move_to_register`). The
    edited model refuses to run its blocks on fewer tokens than its embedding made (its registers dropped)."""

    name = "test_time_register"
    label = "test-time register"
    mitigation = True
    __test__ = False  # not a pytest test class

    @classmethod
    def fit(cls, model: SinkViT, images: torch.Tensor, settings: TrainFreeConfig | Any) -> dict[str, Any]:
        k = float(settings.outlier_k)
        ranked = find_register_neurons(model, images, int(settings.neurons), k)
        return {"neurons": [[b, u] for b, u, _ in ranked], "scores": [s for _, _, s in ranked], "k": k}

    @classmethod
    def apply(cls, model: SinkViT, state: dict[str, Any]) -> SinkViT:
        by_block: dict[int, list[int]] = defaultdict(list)
        for b, u in state["neurons"]:
            b, u = int(b), int(u)
            if not (0 <= b < len(model.blocks)) or not has_mlp(model.blocks[b]) \
                    or not 0 <= u < model.blocks[b].mlp.fc1.out_features:
                raise BadValue(f"the test-time register's neuron (block {b}, unit {u}) is not in this "
                               f"{len(model.blocks)}-block model: the fitted state belongs to another architecture")
            by_block[b].append(u)
        register = add_register(model)
        model.edits.append((cls.label, 1))
        tokens = embedded_tokens(model)
        for b, units in sorted(by_block.items()):
            model.blocks[b].mlp.act.register_forward_hook(
                move_to_register(units, register, model.num_prefix_tokens, tokens))
        return model


def embedded_tokens(model: SinkViT) -> Callable[[], int]:
    """How many tokens `model`'s embedding made last (a hook on `norm_pre`, the last step of `embed_tokens` and of
    `forward_features` before the blocks): the length its blocks must see. Before any forward, the count at the
    model's image size."""
    seen = {"n": model.tokens_per_image()}

    def keep(_module: nn.Module, _args: Any, out: torch.Tensor) -> None:
        seen["n"] = out.shape[1]

    model.norm_pre.register_forward_hook(keep)
    return lambda: seen["n"]
