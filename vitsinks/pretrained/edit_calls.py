"""The post-hoc edits from a notebook (docs/pretrained.md): thin calls to the one implementation of each on the model's
`Backbone` (W8A8, the register neurons and the test-time register, the massive-activation fix, and `remove_edits`),
with the settings checked as the command line checks them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from vitsinks.configs.ranges import check_setting
from vitsinks.configs.schema import QuantConfig, TrainFreeConfig
from vitsinks.diagnostics.neurons import find_register_neurons
from vitsinks.models.seam import Backbone
from vitsinks.posthoc.applied import remove_edits
from vitsinks.posthoc.massive import MeanMassive, ZeroMassive, block_peaks, massive_state
from vitsinks.posthoc.test_time_register import TestTimeRegister
from vitsinks.pretrained.api import as_backbone, check_batch_size, float32_backbone
from vitsinks.pretrained.images import ImageSource, as_images
from vitsinks.quant.outliers import input_maxima
from vitsinks.quant.w8a8 import W8A8, w8a8_state

__all__ = ["add_test_time_register", "apply_massive", "apply_w8a8", "fit_massive", "fit_w8a8", "register_neurons",
           "remove_edits"]


@torch.no_grad()
def fit_w8a8(model: nn.Module | Backbone, images: ImageSource, weight_bits: int = 8, act_bits: int = 8,
             batch_size: int = 16) -> dict[str, Any]:
    """`W8A8.fit`'s state: the largest |input| of every block linear layer (`Block.linears`) over `images`."""
    backbone = float32_backbone(model)
    check_setting(QuantConfig, "weight_bits", weight_bits)
    check_setting(QuantConfig, "act_bits", act_bits)
    check_batch_size(batch_size)
    images = as_images(images)
    ranges, _ = input_maxima(backbone, images, batch_size)
    return w8a8_state(ranges, weight_bits, act_bits, len(images))


def apply_w8a8(model: nn.Module | Backbone, state: dict[str, Any]) -> Backbone:
    """`W8A8.apply`: fake-quantise the block linear layers in place with a `fit_w8a8` state; returns the backbone."""
    return W8A8.apply(as_backbone(model), state)


@torch.no_grad()
def register_neurons(model: nn.Module | Backbone, images: ImageSource, top: int, k: float = 5.0,
                     batch_size: int = 16) -> list[tuple[int, int, float]]:
    """The `top` register neurons (block, unit, score), highest score first (`TestTimeRegister.fit`'s ranking,
    `diagnostics.neurons.find_register_neurons`; `k`: the high-norm threshold, x the image's median norm)."""
    backbone = float32_backbone(model)
    check_setting(TrainFreeConfig, "neurons", top, "top")
    check_setting(TrainFreeConfig, "outlier_k", k, "k")
    check_batch_size(batch_size)
    return find_register_neurons(backbone, as_images(images), top, k, batch_size)


def add_test_time_register(model: nn.Module | Backbone, neurons: Iterable[tuple[int, int]] = ()) -> Backbone:
    """`TestTimeRegister.apply`: the backbone with one more register after the prefix and each register neuron (block,
    unit) of `neurons` moved from the patches onto it. A foreign model runs it through the returned backbone only (its
    embedding adds the register); vitsinks' own ViT gets it in its parameters."""
    return TestTimeRegister.apply(as_backbone(model), {"neurons": [[int(b), int(u)] for b, u in neurons]})


@torch.no_grad()
def fit_massive(model: nn.Module | Backbone, images: ImageSource, massive: int = 2,
                batch_size: int = 16) -> dict[str, Any]:
    """`MassiveFix.fit`'s state: the massive block, its `massive` largest channels and their mean there."""
    backbone = float32_backbone(model)
    check_setting(TrainFreeConfig, "massive", massive)
    check_batch_size(batch_size)
    return massive_state(*block_peaks(backbone, as_images(images), batch_size), massive)


def apply_massive(model: nn.Module | Backbone, state: dict[str, Any], zero: bool = False) -> Backbone:
    """`MeanMassive.apply` (`zero`: `ZeroMassive.apply`): per image, each fitted channel of the massive block's output
    at its massive token set to its fitted mean (or 0), by hooks on the model's own modules."""
    return (ZeroMassive if zero else MeanMassive).apply(as_backbone(model), state)
