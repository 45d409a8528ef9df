"""Simulated W8A8 quantization of the blocks as a post-hoc edit (`w8a8`; docs/quantization.md#definitions): symmetric
per-tensor fake quantization `q(x) = s * clamp(round(x / s), -qmax, qmax)` of every block linear layer's weight
(`s_w = max |W| / qmax`, in place) and input (a static `s_x = max |x| / qmax` calibrated on the float model, applied
by a forward pre-hook); everything else stays in float32.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from vitsinks.models.seam import Backbone, LinearSite
from vitsinks.posthoc.applied import record, refuse_twice
from vitsinks.posthoc.method import METHODS, TrainFreeMethod
from vitsinks.quant.outliers import input_maxima, layer_paths
from vitsinks.utils.errors import BadValue, NonFinite


def qmax(bits: int) -> int:
    """The largest level of a symmetric signed `bits`-bit grid: 2^(bits-1) - 1."""
    return 2 ** (int(bits) - 1) - 1


def scale_of(max_abs: float | torch.Tensor, bits: int) -> float:
    """The per-tensor scale that maps `max_abs` to the top level of a `bits`-bit grid."""
    return float(torch.as_tensor(max_abs).detach()) / qmax(bits)


def fake_quant(x: torch.Tensor, scale: float, bits: int) -> torch.Tensor:
    """`scale * clamp(round(x / scale), -qmax, qmax)`; `x` itself for a zero scale (an all-zero tensor)."""
    if scale <= 0:
        return x
    q = qmax(bits)
    return torch.clamp(torch.round(x / scale), -q, q) * scale


def _input_hook(scale: float, bits: int) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (fake_quant(args[0], scale, bits), *args[1:])
    return hook


@METHODS.register
class W8A8(TrainFreeMethod):
    """Weights and linear-layer inputs of the blocks fake-quantised per tensor (the module docstring)."""

    name = "w8a8"
    label = "W8A8"
    mitigation = False
    group = "quant"
    count_key = "calib_images"

    @classmethod
    def fit(cls, backbone: Backbone, images: torch.Tensor, settings: Any) -> dict[str, Any]:
        """The static input ranges of every block linear layer over `images` (a `QuantConfig` gives the bits)."""
        ranges, _ = input_maxima(backbone, images)
        return w8a8_state(ranges, settings.weight_bits, settings.act_bits, len(images))

    @classmethod
    def apply(cls, backbone: Backbone, state: dict[str, Any]) -> Backbone:
        """Quantise the block linear layers' weights in place and hook their inputs with the fitted scales."""
        refuse_twice(backbone, cls.name)
        record(backbone, cls.name, quantize_layers(layer_paths(backbone), state))
        return backbone


def quantize_layers(layers: dict[str, LinearSite], state: dict[str, Any]) -> list[Any]:
    """Fake-quantise `layers`' weights in place and hook their inputs with `state`'s scales; returns the handles."""
    if list(layers) != list(state["layers"]):
        raise BadValue(f"the W8A8 state was fitted on the linear layers {state['layers']}, this model has "
                       f"{list(layers)}: quantise the model again (python -m vitsinks.quantize)")
    wb, ab = int(state["weight_bits"]), int(state["act_bits"])
    scales = [float(s) for s in state["act_scale"]]
    if not all(math.isfinite(s) and s >= 0 for s in scales):
        raise NonFinite("the W8A8 state holds non-finite activation scales: quantise the model again")
    handles = []
    for mod, s in zip(layers.values(), scales, strict=True):
        with torch.no_grad():
            w = mod.weight
            w.copy_(fake_quant(w, scale_of(w.abs().amax(), wb), wb))
        handles.append(mod.register_forward_pre_hook(_input_hook(s, ab)))
    return handles


def w8a8_state(ranges: dict[str, float], weight_bits: int, act_bits: int, calib_images: int) -> dict[str, Any]:
    """The W8A8 state of calibrated input ranges (`max |x|` by layer name)."""
    layers = list(ranges)
    act_max = torch.tensor([ranges[n] for n in layers], dtype=torch.float64)
    return {"weight_bits": int(weight_bits), "act_bits": int(act_bits), "calib_images": int(calib_images),
            "layers": layers, "act_max": act_max, "act_scale": act_max / qmax(act_bits)}
