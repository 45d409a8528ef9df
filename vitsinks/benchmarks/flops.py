"""Model FLOPs of a training step (counted by `torch.utils.flop_counter` on meta tensors) and the bf16 dense peak of a
GPU from its name: what MFU (model FLOPs utilisation) is made of."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig
from torch.utils.flop_counter import FlopCounterMode

from vitsinks.models import model_from_config
from vitsinks.objectives import Runtime, build_objective

# Dense (half the datasheets' 2:4-sparse figure) bf16 tensor-core peaks in TFLOP/s, from NVIDIA's datasheets; the first
# pattern found in the upper-cased device name wins ("NVIDIA H100 80GB HBM3" is the SXM part).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"GH200", 989.5), (r"H200 NVL", 835.5), (r"H200", 989.5), (r"H100 NVL", 835.5), (r"H100 PCIE", 756.5),
    (r"H100", 989.5), (r"H800 PCIE", 756.5), (r"H800", 989.5), (r"A100", 312.0), (r"A800", 312.0), (r"L40S", 362.05),
    (r"L40\b", 181.05), (r"\bL4\b", 121.0), (r"\bA10\b", 125.0), (r"B200", 2250.0),
)


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak (TFLOP/s) of the GPU named `device_name`; None for a name the table does not know."""
    name = device_name.upper()
    for pattern, peak in PEAK_BF16_TFLOPS:
        if re.search(pattern, name):
            return peak
    return None


def mfu(flops_per_step: float, step_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the peak (TFLOP/s); None without a peak."""
    if peak is None or step_s <= 0:
        return None
    return flops_per_step / step_s / (peak * 1e12)


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of the matrix products and convolutions `fn()` runs (`FlopCounterMode`'s count, the usual MFU one)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@dataclass(frozen=True)
class MetaRuntime(Runtime):
    """A runtime on the meta device (shapes only, no memory, no arithmetic), which has no autocast."""

    def autocast(self) -> AbstractContextManager:
        return nullcontext()


def meta_views(cfg: DictConfig, batch: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Meta tensors shaped like a loader batch of `batch` images with `cfg.views`' views: (views, labels)."""
    meta, v = torch.device("meta"), cfg.views
    views = [torch.empty(batch, 3, v.global_size, v.global_size, device=meta) for _ in range(v.n_global)]
    views += [torch.empty(batch, 3, v.local_size, v.local_size, device=meta) for _ in range(v.n_local)]
    return views, torch.zeros(batch, dtype=torch.long, device=meta)


def step_flops(cfg: DictConfig, inputs: list[torch.Tensor], targets: Any, num_classes: int = 1000) -> int:
    """Model FLOPs of one training step (`step_terms`, forward + backward) of the run `cfg` on meta tensors."""
    objective = build_objective(cfg, MetaRuntime(torch.device("meta")))
    with torch.device("meta"):
        model = objective.setup_model(model_from_config(cfg.model), num_classes)

    def step() -> None:
        total, _ = objective.step_terms(model, inputs, targets)
        total.backward()

    return count_flops(step)
