"""`python -m vitsinks.bench pretrained`: `vitsinks.pretrained.diagnose` and `intervene` (one edit of one head) on
timm ViTs with random weights: seconds per image and the ratio to one plain forward of the same images."""

from __future__ import annotations

import os
import statistics
from typing import cast

import timm
import torch
from timm.models.vision_transformer import Attention, VisionTransformer

from vitsinks.benchmarks.timing import interleaved, table
from vitsinks.pretrained import diagnose, intervene
from vitsinks.utils.errors import BadValue

# size -> timm model (DINOv2 with 4 registers: [CLS], 4 registers and 16 x 16 patches of 14 px at 224 px)
TIMM_MODELS = {"vit_small": "vit_small_patch14_reg4_dinov2", "vit_base": "vit_base_patch14_reg4_dinov2",
               "vit_large": "vit_large_patch14_reg4_dinov2"}
DEFAULT_BATCH = {"vit_small": 4, "vit_base": 4, "vit_large": 2}  # images per size (ViT-L: 2, to keep the run short)


def timm_model(size: str, img_size: int = 224) -> torch.nn.Module:
    """A random-init timm model of `size` (a `TIMM_MODELS` key or any timm model name) at `img_size` px, seed 0."""
    torch.manual_seed(0)
    return timm.create_model(TIMM_MODELS.get(size, size), pretrained=False, img_size=img_size).eval()


@torch.no_grad()
def plant_cls_sink(model: VisionTransformer, block: int) -> None:
    """Head 0 of `block` sends every query to [CLS] (random weights have no sink to edit)."""
    attn = cast(Attention, model.blocks[block].attn)
    qkv, hd, dim = attn.qkv, attn.head_dim, model.embed_dim
    assert qkv.bias is not None and model.cls_token is not None  # timm's ViTs: a qkv bias and [CLS]
    qkv.weight[:hd], qkv.bias[:hd] = 0.0, 1.0
    qkv.weight[dim : dim + hd], qkv.bias[dim : dim + hd] = 0.0, 0.0
    qkv.weight[dim : dim + hd, 0] = 1.0
    model.cls_token[0, 0, 0] = 1e3


def measure(size: str, batch: int, repeats: int, img_size: int = 224) -> dict[str, float]:
    """Median seconds per image of a plain forward, `diagnose` and `intervene` (head 0 of the middle block, with a
    planted [CLS] sink), and the median, least and largest of their per-round ratios to the forward."""
    if batch < 2:
        raise BadValue(f"the pretrained benchmark needs batch >= 2 (the interventions' donor), got {batch}")
    model = cast(VisionTransformer, timm_model(size, img_size))  # the TIMM_MODELS: timm ViTs
    x = torch.randn(batch, 3, img_size, img_size, generator=torch.Generator().manual_seed(1))
    head = (len(model.blocks) // 2, 0)
    plant_cls_sink(model, head[0])
    with torch.no_grad():
        times = interleaved({"forward": lambda: model(x), "diagnose": lambda: diagnose(model, x, batch_size=batch),
                             "intervene": lambda: intervene(model, x, heads=[head], edits=["zero_sink_value"],
                                                            batch_size=batch)},
                            repeats=repeats, warmup=1)
    out = {"forward_s": statistics.median(times["forward"]) / batch, "block": head[0],
           "params_m": sum(p.numel() for p in model.parameters()) / 1e6}
    for what in ("diagnose", "intervene"):
        ratios = [t / f for t, f in zip(times[what], times["forward"], strict=True)]
        out |= {f"{what}_s": statistics.median(times[what]) / batch, f"{what}_ratio": statistics.median(ratios),
                f"{what}_lo": min(ratios), f"{what}_hi": max(ratios)}
    return out


def run(size: str = "vit_small,vit_large", batch: int | None = None, repeats: int = 2, img_size: int = 224) -> str:
    """Return the table: one row per size (comma-separated), `batch` images each."""
    rows = []
    for name in size.split(","):
        n = batch or DEFAULT_BATCH.get(name, 2)
        m = measure(name, n, repeats, img_size)
        rows.append([f"{TIMM_MODELS.get(name, name)} ({m['params_m']:.0f}M)", str(n), f"{m['forward_s']:.3f}",
                     *(f"{m[f'{w}_s']:.3f} ({m[f'{w}_ratio']:.2f}x, {m[f'{w}_lo']:.2f}-{m[f'{w}_hi']:.2f})"
                       for w in ("diagnose", "intervene"))])
    return (f"vitsinks.pretrained.diagnose (every block and head, float32, the recomputation check) and intervene (one "
            f"edit of head 0 of the middle block, a planted [CLS] sink) against one plain forward, random weights, "
            f"{img_size} px, {repeats} interleaved rounds after a warm-up; torch threads {torch.get_num_threads()}, "
            f"{os.cpu_count()} cores\n\n"
            + table(rows, ["model", "images", "forward s/image", "diagnose s/image (x forward, range)",
                           "intervene s/image (x forward, range)"]))
