"""A block's MLP as the register neurons read it (`diagnostics.neurons`, docs/residual.md): `MLPParts`, its input
layer, activation (whose outputs are the units), output layer and LayerScale gain, given by every block's
`mlp_parts()` (`SinkBlock`: `timm_mlp_parts`; each `vitsinks.backbones` view for its library's MLP)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from timm.layers import Mlp
from torch import nn


@dataclass(frozen=True)
class MLPParts:
    """A plain MLP branch, gamma * fc_out(act(fc_in(x))): two `nn.Linear`s around an activation module, nothing
    between `act` and `fc_out`; `gamma` the LayerScale gain (None without)."""

    fc_in: nn.Linear
    act: nn.Module
    fc_out: nn.Linear
    gamma: torch.Tensor | None = None


def timm_mlp_parts(block: nn.Module) -> MLPParts | None:
    """The `MLPParts` of a timm pre-norm block's `mlp` and `ls2`: a plain timm `Mlp` (exactly that class, no
    hidden-layer norm); None for another MLP (a gated one's `act` is only the gate; `NoMLP` has no units)."""
    mlp = block.mlp
    if type(mlp) is not Mlp or not isinstance(mlp.norm, nn.Identity):
        return None
    # timm types fc1 / fc2 as Linear | Conv2d (use_conv); a ViT block's are Linears
    return MLPParts(cast(nn.Linear, mlp.fc1), mlp.act, cast(nn.Linear, mlp.fc2), getattr(block.ls2, "gamma", None))


def plain_mlp(mlp: nn.Module, names: tuple[str, str, str], gamma: torch.Tensor | None) -> MLPParts | None:
    """The `MLPParts` of an MLP whose input layer, activation and output layer are its attributes `names` (two
    `nn.Linear`s and a module, no hidden-layer `norm`), with the gain `gamma`; None for another MLP."""
    fc_in, act, fc_out = (getattr(mlp, a, None) for a in names)
    if isinstance(fc_in, nn.Linear) and isinstance(act, nn.Module) and isinstance(fc_out, nn.Linear) \
            and isinstance(getattr(mlp, "norm", nn.Identity()), nn.Identity):
        return MLPParts(fc_in, act, fc_out, gamma)
    return None
