"""The post-hoc edits of `vitsinks.quant` (W8A8) and `vitsinks.trainfree` (the test-time register) on a pretrained
model, through its views (docs/pretrained.md).

- `fit_w8a8` / `apply_w8a8`: `quant.w8a8`'s fake quantisation of every linear layer inside the model's blocks
  (`BlockView.linears`: the blocks' own `nn.Linear`s, or open_clip's fused attention projections, by a `SinkViT`'s
  names `blocks.<i>.<path>`), static input scales calibrated on images run through the views. The weights are edited
  in place and the input hooks stay on the model: its own forward is quantised too.
- `add_test_time_register`: one zero register after the prefix, without position embedding (`trainfree`'s
  `add_register`), added by the view's embedding (the model is not edited), and, for given register neurons
  (block, unit), their activations moved onto it by `trainfree`'s `move_to_register` hooks on the blocks' MLP
  activation modules; `register_neurons` finds them (`diagnostics.neurons`' ranking, through the views).
- `fit_massive` / `apply_massive`: `trainfree.massive`'s fix of the massive activations (their fitted mean, or 0)
  at the massive block's output, by hooks on the block's own norm before the MLP and on its MLP.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from vitsinks.configs.ranges import check_setting
from vitsinks.configs.schema import QuantConfig, TrainFreeConfig
from vitsinks.diagnostics.neurons import find_register_neurons
from vitsinks.models.passes import block_outputs_by_batch, eval_mode
from vitsinks.pretrained.api import as_foreign, check_batch_size, require_float32
from vitsinks.pretrained.applied import APPLIED, LABELS, record, refuse_twice
from vitsinks.pretrained.inputs import ImageSource, as_images
from vitsinks.pretrained.views import BlockView, Foreign, own_linears
from vitsinks.quant.stats import LinearSite, layer_input_maxima
from vitsinks.quant.w8a8 import quantize_layers, w8a8_state
from vitsinks.trainfree.massive import massive_state, peaks_of
from vitsinks.trainfree.test_time_register import move_to_register
from vitsinks.utils.errors import BadValue


def remove_edits(model: nn.Module | Foreign) -> list[str]:
    """Take the hooks of `add_test_time_register` and `apply_massive` off the model (without W8A8, its own forward is
    then the original again); returns the edits removed. W8A8 stays: its weights were quantised in place (load the
    model again to undo it)."""
    module = model.model if isinstance(model, Foreign) else model
    applied = APPLIED.get(module, {})
    removed = [e for e in applied if e != "w8a8"]
    for e in removed:
        for h in applied.pop(e):
            h.remove()
    return [LABELS[e] for e in removed]


def block_linears(foreign: Foreign) -> dict[str, LinearSite]:
    """Every linear layer inside the model's blocks by its path, `blocks.<i>.<path in the block>`, in module order
    (`BlockView.linears`; timm's names are a `SinkViT`'s: `blocks.0.attn.qkv`, ...; open_clip's are given a
    `SinkViT`'s names)."""
    return {f"blocks.{i}.{name}": layer for i, blk in enumerate(foreign.blocks)
            for name, layer in (blk.linears() if isinstance(blk, BlockView) else own_linears(blk)).items()}


@torch.no_grad()
def fit_w8a8(model: nn.Module | Foreign, images: ImageSource, weight_bits: int = 8, act_bits: int = 8,
             batch_size: int = 16) -> dict[str, Any]:
    """`quant.w8a8.W8A8.fit`'s state for a pretrained model: the largest |input| of every block linear layer
    (`block_linears`) over `images` run through the views. The bits are checked as the command line checks
    `quant.weight_bits` / `quant.act_bits`."""
    foreign = as_foreign(model)
    require_float32(foreign)
    check_setting(QuantConfig, "weight_bits", weight_bits)
    check_setting(QuantConfig, "act_bits", act_bits)
    check_batch_size(batch_size)
    images = as_images(images)
    with eval_mode(foreign.model) as device:
        ranges, _ = layer_input_maxima(block_linears(foreign), foreign.forward_features, images, device,
                                       batch_size)
    return w8a8_state(ranges, weight_bits, act_bits, len(images))


def apply_w8a8(model: nn.Module | Foreign, state: dict[str, Any]) -> Foreign:
    """Fake-quantise the model's block linear layers in place with a `fit_w8a8` state; returns its view."""
    foreign = as_foreign(model)
    refuse_twice(foreign, "w8a8")
    record(foreign, "w8a8", quantize_layers(block_linears(foreign), state))
    return foreign


def add_test_time_register(model: nn.Module | Foreign, neurons: Iterable[tuple[int, int]] = ()) -> Foreign:
    """The model's view with one more register (zero, no position embedding, after [CLS] and the model's registers)
    and, for each register neuron (block, unit) of `neurons`, its activation moved from the patches onto that
    register (`trainfree`'s `move_to_register`). The hooks stay on the model's MLP activations and refuse any other
    token count, so the edited model runs through this view only (`diagnose`, `intervene`, `forward_features`)."""
    foreign = as_foreign(model)
    refuse_twice(foreign, "test_time_register")
    register, base = foreign.num_prefix, foreign.embed
    seen = {"n": -1}

    def embed(images: torch.Tensor) -> torch.Tensor:
        x = base(images)
        x = torch.cat([x[:, :register], x.new_zeros(x.shape[0], 1, x.shape[2]), x[:, register:]], dim=1)
        seen["n"] = x.shape[1]
        return x

    by_block: dict[int, list[int]] = defaultdict(list)
    for b, u in neurons:
        by_block[int(b)].append(int(u))
    acts = {}
    for b, units in sorted(by_block.items()):
        if not 0 <= b < len(foreign.blocks):
            raise BadValue(f"register neuron block {b}: the model has {len(foreign.blocks)} blocks")
        parts = foreign.blocks[b].mlp_parts()
        if parts is None:
            raise BadValue(f"block {b}'s {type(foreign.blocks[b].mlp).__name__} is no plain MLP (in -> activation -> "
                           f"out): register neurons need one")
        width = parts.fc_in.out_features
        if not all(0 <= u < width for u in units):
            raise BadValue(f"register neuron units {units} of block {b}: its MLP has {width} units")
        acts[b] = (parts.act, units)
    record(foreign, "test_time_register", [act.register_forward_hook(move_to_register(units, register, register + 1,
                                                                                         lambda: seen["n"]))
                                            for act, units in acts.values()])
    return dataclasses.replace(foreign, embed=embed, num_registers=foreign.num_registers + 1,
                               name=f"{foreign.name} + test-time register")


@torch.no_grad()
def register_neurons(model: nn.Module | Foreign, images: ImageSource, top: int, k: float = 5.0,
                     batch_size: int = 16) -> list[tuple[int, int, float]]:
    """The `top` register neurons (block, unit, score), highest score first, as `diagnostics.neurons`'
    `find_register_neurons` ranks them, through the views: per unit, the mean over the images with a high-norm
    patch at the last block (norm > `k` x the image's median) of its mean |activation| at those patches. `top` and
    `k` are checked as the command line checks `trainfree.neurons` and `trainfree.outlier_k`."""
    foreign = as_foreign(model)
    require_float32(foreign)
    check_setting(TrainFreeConfig, "neurons", top, "top")
    check_setting(TrainFreeConfig, "outlier_k", k, "k")
    check_batch_size(batch_size)
    images = as_images(images)
    return find_register_neurons(foreign, images, top, k, batch_size)


@torch.no_grad()
def fit_massive(model: nn.Module | Foreign, images: ImageSource, massive: int = 2,
                batch_size: int = 16) -> dict[str, Any]:
    """`trainfree.massive.MassiveFix.fit`'s state through the views: the massive block, its `massive` largest
    channels and their mean at the massive token."""
    foreign = as_foreign(model)
    require_float32(foreign)
    check_setting(TrainFreeConfig, "massive", massive)
    check_batch_size(batch_size)
    images = as_images(images)
    with eval_mode(foreign.model):
        return massive_state(*peaks_of(block_outputs_by_batch(foreign, images, batch_size)), massive)


def mlp_branch(blk: BlockView) -> tuple[nn.Module, torch.Tensor | None]:
    """The block's own norm before its MLP (`norm2`: timm `norm2`, transformers `norm2` / `layernorm_after` /
    `layer_norm2`, open_clip `ln_2`) and the MLP branch's LayerScale gain (`ls2`'s; None without)."""
    return blk.norm2, getattr(blk.ls2, "gamma", None)


def apply_massive(model: nn.Module | Foreign, state: dict[str, Any], zero: bool = False) -> Foreign:
    """Set, per image, each fitted channel of the massive block's output at its massive token (largest |h|) to its
    fitted mean (`zero`: to 0), as `trainfree.massive.fix_channels`: the MLP's output is edited, divided by the
    branch's LayerScale gain, from the stream before the MLP (kept by a hook on the norm). Hooks on the model's own
    modules: its own forward and the views' recomputation both see the edit."""
    foreign = as_foreign(model)
    refuse_twice(foreign, "massive")
    block, channels = int(state["block"]), [int(c) for c in state["channels"]]
    if not 0 <= block < len(foreign.blocks):
        raise BadValue(f"the massive block {block} is not one of the model's {len(foreign.blocks)} blocks")
    blk = foreign.blocks[block]
    norm, gamma = mlp_branch(blk)
    ch = torch.tensor(channels, dtype=torch.long)
    gain = torch.ones(len(channels), dtype=torch.float64) if gamma is None else gamma.detach().double().cpu()[ch]
    if (gain == 0).any():
        raise BadValue(f"the LayerScale gain of block {block} is 0 at some of the channels {channels}: no edit reaches")
    target = torch.tensor([0.0] * len(channels) if zero else [float(v) for v in state["means"]], dtype=torch.float64)
    seen: dict[str, torch.Tensor] = {}

    def keep_mid(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        seen["x"] = args[0]

    def edit(_module: nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
        i, g = ch.to(out.device), gain.to(out)
        h = seen.pop("x")[:, :, i] + out[:, :, i] * g  # (B, N, K) the block's output at the channels
        token = h.abs().argmax(dim=1)  # (B, K)
        current = h.gather(1, token[:, None]).squeeze(1)
        out = out.clone()
        rows = torch.arange(out.shape[0], device=out.device)[:, None]
        out[rows, token, i[None, :]] += (target.to(out) - current) / g
        return out

    record(foreign, "massive", [norm.register_forward_pre_hook(keep_mid), blk.mlp.register_forward_hook(edit)])
    return foreign
