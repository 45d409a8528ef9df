"""Outlier statistics of the inputs of every linear layer of the blocks (docs/quantization.md#definitions): per block
and layer, the mean over images of the Pearson kurtosis of the input (`kurtosis`, None where it is constant on every
image) and `max |x|` (`inf_norm`). Layers are keyed by their path in the block without the `attn.` / `mlp.` prefix
(`qkv`, `proj`, `fc1`, `fc2`, `gate`, `pathway.inp`, ...).
"""

from __future__ import annotations

import math
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
    """Per block, the path (`blocks.3.attn.qkv`) of each linear layer by key (`layer_key`), in module order."""
    return [{layer_key(name): f"blocks.{i}.{name}" for name in block.linears()}
            for i, block in enumerate(backbone.blocks)]


def layer_paths(backbone: Backbone) -> dict[str, LinearSite]:
    """Every block linear layer (`Block.linears`) by its path `blocks.<i>.<path in the block>`, in module order."""
    return {f"blocks.{i}.{name}": layer for i, block in enumerate(backbone.blocks)
            for name, layer in block.linears().items()}


def pearson_kurtosis(x: torch.Tensor) -> torch.Tensor:
    """Per row of `x` (B, ...), the Pearson kurtosis m4 / m2^2 of its entries in float64; NaN for a constant row."""
    flat = x.detach().reshape(x.shape[0], -1).double()
    d = flat - flat.mean(dim=1, keepdim=True)
    m2 = d.square().mean(dim=1)
    return d.square().square().mean(dim=1) / m2.square()


class _Recorder:
    """Forward pre-hooks on `layers` accumulating max |x|, the image count and the defined per-image kurtoses."""

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
    """(max |x|, mean per-image kurtosis (only with `kurtosis`)) of every block linear layer's input by its path,
    over `images` in batches; a layer the forward never reached, or a non-finite input: `NonFinite`."""
    layers = layer_paths(backbone)
    with eval_mode(backbone) as device:
        rec = _Recorder(layers, kurtosis)
        try:
            for lo in range(0, len(images), batch_size):
                backbone.forward_features(images[lo : lo + batch_size].to(device))
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
    """`{"kurtosis": {key: [L]}, "inf_norm": {key: [L]}}` per layer key and block (None: no such layer)."""
    inf, kurt = input_maxima(backbone, images, batch_size, kurtosis=True)
    per_block = block_layers(backbone)
    keys = list(dict.fromkeys(k for blk in per_block for k in blk))
    return {stat: {k: [values[blk[k]] if k in blk else None for blk in per_block] for k in keys}
            for stat, values in (("kurtosis", kurt), ("inf_norm", inf))}


def stat_max(by_block: dict[str, dict[str, list[float | None]]], stat: str) -> float:
    """The largest value of one statistic over blocks and layers (NaN when there is none)."""
    values = [v for layer in by_block.get(stat, {}).values() for v in layer if v is not None]
    return max(values) if values else math.nan
