"""Outlier statistics of the inputs of every linear layer of the blocks (docs/quantization.md).

Per block and layer, over `images`:
- `kurtosis`: per image, the Pearson kurtosis of all N x C entries of the layer's input (tokens x channels,
  flattened), `E[(x - mu)^4] / sigma^4` with population moments (a Gaussian has 3), then the mean over the images
  where it is defined (not constant; e.g. the global pathway's `pathway.out` with `state_dim=1` reads one number
  per image): None for a layer whose input is constant on every image;
- `inf_norm`: `max |x|` over tokens, channels and images (the range a static per-tensor quantiser must cover).

The layers are every linear layer inside a block (`Block.linears` of the model's `Backbone`: for vitsinks' own ViT
every `nn.Linear`, `attn.qkv`, `attn.proj`, `mlp.fc1`, `mlp.fc2`, and the gate's or the global pathway's when the
variant has them), keyed by their path in the block without the `attn.` / `mlp.` prefix: `qkv`, `proj`, `fc1`, `fc2`,
`gate`, `pathway.inp`, ...
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitsinks.models.passes import eval_mode
from vitsinks.models.seam import Backbone, LinearSite
from vitsinks.utils.errors import NonFinite


def layer_key(path: str) -> str:
    """A linear layer's key from its path in the block (`attn.qkv` -> `qkv`, `pathway.inp` stays)."""
    head, _, rest = path.partition(".")
    return rest if head in ("attn", "mlp") and rest else path


def block_layers(backbone: Backbone) -> list[dict[str, str]]:
    """Per block, the path (`blocks.3.attn.qkv`) of each of its linear layers by key (`layer_key`), in module
    order."""
    return [{layer_key(name): f"blocks.{i}.{name}" for name in block.linears()}
            for i, block in enumerate(backbone.blocks)]


def layer_paths(backbone: Backbone) -> dict[str, LinearSite]:
    """Every block linear layer (`Block.linears`) by its path, `blocks.<i>.<path in the block>`, in module order (a
    `SinkViT`'s module paths; a view's layers under a `SinkViT`'s names where its library's differ)."""
    return {f"blocks.{i}.{name}": layer for i, block in enumerate(backbone.blocks)
            for name, layer in block.linears().items()}


def pearson_kurtosis(x: torch.Tensor) -> torch.Tensor:
    """Per row of `x` (B, ...), the Pearson kurtosis of all its entries in float64 (B,): `m4 / m2^2` with central
    population moments (`scipy.stats.kurtosis(fisher=False)`); NaN for a constant row."""
    flat = x.detach().reshape(x.shape[0], -1).double()
    d = flat - flat.mean(dim=1, keepdim=True)
    m2 = d.square().mean(dim=1)
    return d.square().square().mean(dim=1) / m2.square()


class _Recorder:
    """Forward pre-hooks on layers accumulating the sum and count of the defined per-image kurtoses, the image count
    and max |x|."""

    def __init__(self, layers: dict[str, LinearSite], kurtosis: bool) -> None:
        self.kurt_sum = dict.fromkeys(layers, 0.0)
        self.kurt_count = dict.fromkeys(layers, 0)
        self.count = dict.fromkeys(layers, 0)
        self.inf = dict.fromkeys(layers, 0.0)
        self.bad: set[str] = set()
        self.kurtosis = kurtosis
        self.handles = [mod.register_forward_pre_hook(self._hook(name)) for name, mod in layers.items()]

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0]
            top = float(x.detach().abs().amax())
            if not math.isfinite(top):  # max() would drop a NaN
                self.bad.add(name)
            self.inf[name] = max(self.inf[name], top)
            if self.kurtosis:  # NaN only for a constant image here: a NaN or inf input is caught by `top`
                k = pearson_kurtosis(x)
                k = k[torch.isfinite(k)]
                self.kurt_sum[name] += float(k.sum())
                self.kurt_count[name] += k.numel()
            self.count[name] += x.shape[0]
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@torch.no_grad()
def input_maxima(backbone: Backbone, images: torch.Tensor, batch_size: int = 64,
                 kurtosis: bool = False) -> tuple[dict[str, float], dict[str, float | None]]:
    """(max |x|, mean per-image kurtosis (empty without `kurtosis`; None for a layer whose input is constant on
    every image)) of the input of every block linear layer by its module path (`layer_paths`), over `images` run
    through the backbone (`forward_features`) in batches on the model's device. A layer the forward never reached,
    or a non-finite input, is a `NonFinite` error."""
    with eval_mode(backbone) as device:
        return layer_input_maxima(layer_paths(backbone), backbone.forward_features, images, device, batch_size,
                                  kurtosis)


@torch.no_grad()
def layer_input_maxima(layers: dict[str, LinearSite], forward: Callable[[torch.Tensor], Any], images: torch.Tensor,
                       device: torch.device | str = "cpu", batch_size: int = 64,
                       kurtosis: bool = False) -> tuple[dict[str, float], dict[str, float | None]]:
    """`input_maxima` of the given `layers` (by name) while `forward` runs on `images` in batches on `device` (the
    model in evaluation mode: the caller's)."""
    rec = _Recorder(layers, kurtosis)
    try:
        for lo in range(0, len(images), batch_size):
            forward(images[lo : lo + batch_size].to(device))
    finally:
        rec.remove()
    missing = [n for n, c in rec.count.items() if c == 0]
    if missing:
        raise NonFinite(f"the forward pass never reached the linear layers {', '.join(missing)}: no statistics")
    bad = [n for n in layers if n in rec.bad]
    if bad:
        raise NonFinite(f"non-finite inputs of the linear layers {', '.join(bad)}: the model diverged or its weights "
                        f"are broken; nothing was written")
    kurt = {n: rec.kurt_sum[n] / rec.kurt_count[n] if rec.kurt_count[n] else None for n in layers} if kurtosis else {}
    return rec.inf, kurt


def linear_input_stats(backbone: Backbone, images: torch.Tensor,
                       batch_size: int = 64) -> dict[str, dict[str, list[float | None]]]:
    """`{"kurtosis": {key: [L]}, "inf_norm": {key: [L]}}`: the statistics (module docstring) of every block
    linear layer's input over `images`, per layer key and block (None in a block without that layer, and a kurtosis
    of None where the input is constant on every image)."""
    inf, kurt = input_maxima(backbone, images, batch_size, kurtosis=True)
    per_block = block_layers(backbone)
    keys = list(dict.fromkeys(k for blk in per_block for k in blk))
    return {stat: {k: [values[blk[k]] if k in blk else None for blk in per_block] for k in keys}
            for stat, values in (("kurtosis", kurt), ("inf_norm", inf))}


def stat_max(by_block: dict[str, dict[str, list[float | None]]], stat: str) -> float:
    """The largest value of one statistic over blocks and layers (NaN when there is none)."""
    values = [v for layer in by_block.get(stat, {}).values() for v in layer if v is not None]
    return max(values) if values else math.nan
