"""Test-time registers (Jiang et al. 2025, docs/trainfree.md): one extra, untrained prefix token, and the register
neurons' activations moved onto it from the patches, on any model through its `Backbone`."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitsinks.configs.schema import TrainFreeConfig
from vitsinks.diagnostics.neurons import find_register_neurons
from vitsinks.models.seam import AddedRegister, Backbone
from vitsinks.posthoc.applied import record, refuse_twice
from vitsinks.posthoc.method import METHODS, TrainFreeMethod
from vitsinks.utils.errors import BadValue


def with_register(backbone: Backbone, label: str) -> AddedRegister:
    """`backbone` with one more zero register after its prefix (its family's own, else its embedding's)."""
    if backbone.add_register is not None:
        return backbone.add_register(label)
    register, base = backbone.num_prefix, backbone.embed
    seen = {"n": -1}

    def embed(images: torch.Tensor) -> torch.Tensor:
        x = base(images)
        x = torch.cat([x[:, :register], x.new_zeros(x.shape[0], 1, x.shape[2]), x[:, register:]], dim=1)
        seen["n"] = x.shape[1]
        return x

    grown = dataclasses.replace(backbone, embed=embed, num_registers=backbone.num_registers + 1,
                                name=f"{backbone.name} + {label}")
    return AddedRegister(grown, lambda: seen["n"], [])


ActHook = Callable[[nn.Module, Any, torch.Tensor], torch.Tensor]


def move_to_register(units: list[int], register: int, first_patch: int,
                     tokens: Callable[[], int] | None = None) -> ActHook:
    """A forward hook for a block's MLP activation: each of `units` takes at token `register` its maximum over the
    image and 0 at every patch (from `first_patch` on); a sequence not `tokens()` long (registers dropped): refused."""
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


def neuron_sites(backbone: Backbone, neurons: Any) -> dict[int, tuple[nn.Module, list[int]]]:
    """Per block with register neurons among `neurons`: its MLP activation and units; `BadValue` if not in the model."""
    by_block: dict[int, list[int]] = defaultdict(list)
    depth = len(backbone.blocks)
    for b, u in neurons:
        b, u = int(b), int(u)
        parts = backbone.blocks[b].mlp_parts() if 0 <= b < depth else None
        if parts is None and 0 <= b < depth:
            raise BadValue(f"the test-time register's neuron (block {b}, unit {u}) is not in this {depth}-block model: "
                           f"block {b}'s {type(backbone.blocks[b].mlp).__name__} is no plain MLP (in -> activation -> "
                           f"out), which register neurons need")
        if parts is None or not 0 <= u < parts.fc_in.out_features:
            raise BadValue(f"the test-time register's neuron (block {b}, unit {u}) is not in this {depth}-block "
                           f"model: the fitted state belongs to another architecture")
        by_block[b].append(u)
    return {b: (backbone.blocks[b].mlp_parts().act, units)  # type: ignore[union-attr]
            for b, units in sorted(by_block.items())}


@METHODS.register
class TestTimeRegister(TrainFreeMethod):
    """fit: the top `settings.neurons` register neurons; apply: one more register with their activations."""

    name = "test_time_register"
    label = "test-time register"
    mitigation = True
    __test__ = False  # not a pytest test class

    @classmethod
    def fit(cls, backbone: Backbone, images: torch.Tensor, settings: TrainFreeConfig | Any) -> dict[str, Any]:
        k = float(settings.outlier_k)
        ranked = find_register_neurons(backbone, images, int(settings.neurons), k)
        return {"neurons": [[b, u] for b, u, _ in ranked], "scores": [s for _, _, s in ranked], "k": k}

    @classmethod
    def apply(cls, backbone: Backbone, state: dict[str, Any]) -> Backbone:
        refuse_twice(backbone, cls.name)
        sites = neuron_sites(backbone, state["neurons"])
        register = backbone.num_prefix
        grown = with_register(backbone, cls.label)
        hooks = [act.register_forward_hook(move_to_register(units, register, register + 1, grown.tokens))
                 for act, units in sites.values()]
        record(grown.backbone, cls.name, [*hooks, *grown.handles], view_only=backbone.add_register is None)
        return grown.backbone
