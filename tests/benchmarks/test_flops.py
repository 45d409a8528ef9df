"""Model FLOPs counted on meta tensors against hand counts, the bf16 peaks by device name, and MFU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.tiny import TINY, TINY_VIT
from vitsinks.benchmarks.flops import count_flops, meta_views, mfu, peak_tflops, step_flops
from vitsinks.configs.schema import load_config


def test_a_linear_layer_costs_two_flops_per_multiply_add_forward_and_twice_that_backward() -> None:
    lin = torch.nn.Linear(7, 5, device="meta")
    x = torch.empty(3, 7, device="meta", requires_grad=True)
    # forward 2*3*7*5; backward: the input's gradient and the weight's, each as much again
    assert count_flops(lambda: lin(x).sum().backward()) == 3 * (2 * 3 * 7 * 5)
    x = x.detach()  # no input gradient: the weight's only
    assert count_flops(lambda: lin(x).sum().backward()) == 2 * (2 * 3 * 7 * 5)


def closed_form(cfg, batch: int, num_classes: int, depth: int, dim: int, patch: int, gate: bool = False) -> int:
    """Hand count of a LeJEPA step: per image of N tokens a block costs 24*N*d^2 (qkv, proj, MLP of ratio 4) +
    4*N^2*d (scores, values) forward, twice that backward; (+ 2*N*d^2 forward for an elementwise gate's
    Linear(d, d)); the patch embedding forward + its weight's gradient (the pixels need none); the projector
    (three Linears) x3; the probe (LayerNorm + Linear on the detached [CLS]: its input gradient feeds the LayerNorm's
    parameters) x3; SIGReg's projection onto the slices forward + the projections' gradient."""
    v, o = cfg.views, cfg.objective

    def image(size: int) -> int:
        n = (size // patch) ** 2 + 1
        per_block = 24 * n * dim**2 + 4 * n**2 * dim + (2 * n * dim**2 if gate else 0)
        return 3 * depth * per_block + 2 * (2 * (n - 1) * 3 * patch**2 * dim)

    mg, ml = v.n_global * batch, v.n_local * batch
    total = mg * image(v.global_size) + ml * image(v.local_size)
    total += 3 * 2 * (dim * o.proj_hidden + o.proj_hidden**2 + o.proj_hidden * o.proj_out) * (mg + ml)
    total += 3 * 2 * dim * num_classes * mg
    return total + 2 * 2 * (mg + ml) * o.proj_out * o.slices


@pytest.mark.parametrize("exp", ["base", "gate"])
def test_the_step_of_a_tiny_run_counts_its_closed_form(exp: str) -> None:
    cfg = load_config([*TINY, f"exp={exp}"])  # 2 global views of 32 px and 2 local of 16 px
    views, labels = meta_views(cfg, 3)
    got = step_flops(cfg, views, labels, num_classes=4)
    assert got == closed_form(cfg, 3, 4, TINY_VIT["depth"], TINY_VIT["embed_dim"], TINY_VIT["patch_size"],
                              gate=exp == "gate")


@pytest.mark.slow
def test_the_paper_recipe_at_vit_large_counts_its_closed_form_and_the_issue_figure() -> None:
    cfg = load_config(["recipe=paper"])  # ViT-L/16, 4 global views of 224 px, no local ones
    views, labels = meta_views(cfg, 256)
    got = step_flops(cfg, views, labels, num_classes=1000)
    assert got == closed_form(cfg, 256, 1000, depth=24, dim=1024, patch=16)
    # the issue's estimate: ~123 GFLOPs per 197-token view forward, x3 for forward + backward, 4 x 256 views
    assert got == pytest.approx(3 * 123e9 * 4 * 256, rel=0.01)


def test_peaks_by_device_name() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.5  # the SXM part
    assert peak_tflops("NVIDIA H100 PCIe") == 756.5
    assert peak_tflops("NVIDIA H100 NVL") == 835.5
    assert peak_tflops("NVIDIA H200") == 989.5
    assert peak_tflops("NVIDIA H200 NVL") == 835.5
    assert peak_tflops("NVIDIA GH200 480GB") == 989.5
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == peak_tflops("NVIDIA A100 80GB PCIe") == 312.0
    assert peak_tflops("NVIDIA L40S") == 362.05
    assert peak_tflops("NVIDIA L40") == 181.05
    assert peak_tflops("NVIDIA L4") == 121.0
    assert peak_tflops("NVIDIA A10") == 125.0
    for unknown in ("NVIDIA A10G", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090", "cpu", ""):
        assert peak_tflops(unknown) is None, unknown


def test_mfu_is_achieved_flops_over_the_peak() -> None:
    # 400 TFLOPs in 0.5 s on a 1000 TFLOP/s part: 800 TFLOP/s achieved, 80%
    assert mfu(400e12, 0.5, 1000.0) == pytest.approx(0.8)
    assert mfu(400e12, 0.5, None) is None
