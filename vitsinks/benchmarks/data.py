"""`python -m vitsinks.bench data`: CPU time per image of the paper recipe's views (`views.style=dino`) on
ImageNet-size JPEGs, `views.backend=cpu` against the CPU part of `views.backend=device`, and the device part's time."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitsinks.benchmarks.timing import interleaved, ratio_stats, table
from vitsinks.configs.schema import load_config
from vitsinks.data.crops import SeededViews, view_transform
from vitsinks.data.device_crops import CropFlipViews, DeviceViews, ViewBatch, collate_crops, view_specs
from vitsinks.data.imagefolder import ImageFolderSplit


def natural_image(seed: int, width: int = 500, height: int = 375) -> Image.Image:
    """A seeded photo-like RGB image (colour noise at several scales): it costs what photographs cost to process."""
    rng = np.random.default_rng(seed)
    img = np.zeros((height, width, 3))
    for cell, weight in ((64, 1.0), (16, 0.5), (4, 0.25), (1, 0.12)):
        noise = rng.standard_normal((height // cell + 2, width // cell + 2, 3)).astype(np.float32)
        layer = np.stack([np.asarray(Image.fromarray(noise[..., c]).resize((width, height), Image.Resampling.BICUBIC))
                          for c in range(3)], -1)
        img += weight * layer
    img = (img - img.mean((0, 1))) / img.std((0, 1)) * rng.uniform(30, 60, 3) + rng.uniform(70, 180, 3)
    return Image.fromarray(img.clip(0, 255).astype(np.uint8))


def jpeg_folder(root: Path, n: int, width: int = 500, height: int = 375) -> Path:
    """`root/train/n00000000/*.JPEG`: `n` seeded `natural_image`s saved as JPEG (quality 90), in ImageFolder layout."""
    folder = root / "train" / "n00000000"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        natural_image(i, width, height).save(folder / f"img_{i:04d}.JPEG", quality=90)
    return root


def cpu_times(fns: Mapping[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """`interleaved`'s rounds, each call's CPU time (this process's, not wall time: other load does not count)."""
    spent: dict[str, list[float]] = {k: [] for k in fns}

    def timed(name: str) -> Callable[[], None]:
        def call() -> None:
            t0 = time.process_time()
            fns[name]()
            spent[name].append(time.process_time() - t0)
        return call

    interleaved({k: timed(k) for k in fns}, repeats=repeats, warmup=warmup)
    return {k: v[warmup:] for k, v in spent.items()}


def device_ms(views: DeviceViews, dataset: SeededViews, n: int, repeats: int) -> float:
    """Median ms per image of the device part (crops already there): wall time on CUDA, CPU time on a CPU."""
    crops, _, _ = collate_crops([dataset[i] for i in range(n)])
    assert isinstance(crops, ViewBatch)  # n readable images
    batch = crops.to(views.device)
    if views.device.type != "cuda":
        return float(np.median(cpu_times({"device": lambda: views(batch)}, repeats)["device"])) / n * 1e3
    times = []
    for r in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        views(batch)
        torch.cuda.synchronize()
        if r:
            times.append(time.perf_counter() - t0)
    return float(np.median(times)) / n * 1e3


def run(batch: int = 32, repeats: int = 5) -> str:
    """Return the per-image table and the ratio (target >= 4)."""
    v = load_config(["recipe=paper", "views.style=dino"]).views  # the style both backends have
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what a loader worker runs with: the times are per core (on a CPU, all of them)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            base = ImageFolderSplit(jpeg_folder(Path(tmp), batch), "train")
            old = SeededViews(base, view_transform(v), seed=0)
            new = SeededViews(base, CropFlipViews(view_specs(v)), seed=0)
            times = cpu_times({"cpu": lambda: [old[i] for i in range(batch)],
                               "device": lambda: [new[i] for i in range(batch)]}, repeats)
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            stage = device_ms(DeviceViews(view_specs(v), device), new, batch, repeats)
    finally:
        torch.set_num_threads(threads)
    med, lo, hi = ratio_stats(times["cpu"], times["device"])
    ms = {k: float(np.median(t)) / batch * 1e3 for k, t in times.items()}
    px = sum(s.size[0] * s.size[1] * 3 for s in view_specs(v))
    rows = [["views.backend=cpu: decode + lightly views (fp32)", f"{ms['cpu']:.2f}", f"{1e3 / ms['cpu']:.0f}",
             f"{px * 4 / 1e6:.2f}"],
            ["views.backend=device, CPU part: decode + crop + flip (uint8)", f"{ms['device']:.2f}",
             f"{1e3 / ms['device']:.0f}", f"{px / 1e6:.2f}"],
            [f"views.backend=device, device part on {device.type}"
             + (" (wall time)" if device.type == "cuda" else " (CPU time)"), f"{stage:.2f}",
             f"{1e3 / stage:.0f}" if device.type != "cuda" else "", ""]]
    return (f"paper recipe views ({len(view_specs(v))} x {v.global_size} px), {batch} JPEGs of 500 x 375, CPU time "
            f"(one thread, as in a loader worker), median of {repeats} interleaved rounds\n\n"
            + table(rows, ["pipeline", "ms per image", "images/s per core", "MB shipped per image"])
            + f"\n\nCPU time per image, cpu pipeline / device path's CPU part: {med:.2f}x (IQR {lo:.2f}-{hi:.2f}; "
              f"target >= 4)")
