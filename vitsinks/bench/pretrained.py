"""`python -m vitsinks.bench pretrained`: `vitsinks.pretrained.diagnose` on unmodified timm ViTs (random weights, no
download), seconds per image and the ratio to one plain forward of the same images, side by side."""

from __future__ import annotations

import os
import statistics

import timm
import torch

from vitsinks.bench import interleaved, table
from vitsinks.pretrained import diagnose

# size -> timm model (DINOv2 with 4 registers: [CLS], 4 registers and 16 x 16 patches of 14 px at 224 px)
TIMM_MODELS = {"vit_small": "vit_small_patch14_reg4_dinov2", "vit_base": "vit_base_patch14_reg4_dinov2",
               "vit_large": "vit_large_patch14_reg4_dinov2"}
DEFAULT_BATCH = {"vit_small": 4, "vit_base": 4, "vit_large": 2}  # images per size (ViT-L: 2, to keep the run short)


def timm_model(size: str, img_size: int = 224) -> torch.nn.Module:
    """A random-init timm model of `size` (a `TIMM_MODELS` key or any timm model name) at `img_size` px, seed 0."""
    torch.manual_seed(0)
    return timm.create_model(TIMM_MODELS.get(size, size), pretrained=False, img_size=img_size).eval()


def measure(size: str, batch: int, repeats: int, img_size: int = 224) -> dict[str, float]:
    """Median seconds per image of a plain forward and of `diagnose` (every block and head), and the median, least
    and largest of their per-round ratios, over `repeats` interleaved rounds after one warm-up round (few rounds:
    a range, not quartiles)."""
    model = timm_model(size, img_size)
    x = torch.randn(batch, 3, img_size, img_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        times = interleaved({"forward": lambda: model(x), "diagnose": lambda: diagnose(model, x, batch_size=batch)},
                            repeats=repeats, warmup=1)
    ratios = [d / f for d, f in zip(times["diagnose"], times["forward"], strict=True)]
    return {"forward_s": statistics.median(times["forward"]) / batch,
            "diagnose_s": statistics.median(times["diagnose"]) / batch, "ratio": statistics.median(ratios),
            "ratio_lo": min(ratios), "ratio_hi": max(ratios),
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6}


def run(size: str = "vit_small,vit_large", batch: int | None = None, repeats: int = 2, img_size: int = 224) -> str:
    """Print and return the table: one row per size (comma-separated), `batch` images each (default
    `DEFAULT_BATCH`)."""
    rows = []
    for name in size.split(","):
        n = batch or DEFAULT_BATCH.get(name, 2)
        m = measure(name, n, repeats, img_size)
        rows.append([f"{TIMM_MODELS.get(name, name)} ({m['params_m']:.0f}M)", str(n), f"{m['forward_s']:.3f}",
                     f"{m['diagnose_s']:.3f}", f"{m['ratio']:.2f}", f"{m['ratio_lo']:.2f}-{m['ratio_hi']:.2f}"])
    out = (f"vitsinks.pretrained.diagnose (every block and head, float32, the recomputation check) against one plain "
           f"forward, random weights, {img_size} px, {repeats} interleaved rounds after a warm-up; torch threads "
           f"{torch.get_num_threads()}, {os.cpu_count()} cores\n\n"
           + table(rows, ["model", "images", "forward s/image", "diagnose s/image", "ratio", "range"]))
    print(out)
    return out
