"""The probes' and the quantization's features read through the model seam are, for vitsinks' own ViT, bit for bit
what timm's own forwards compute (`forward_intermediates`, `forward_features`, forward hooks on the blocks): reading
every model through the seam changes no number of a vitsinks run."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.tiny import images, tiny_vit
from vitsinks.backbones import adapt
from vitsinks.probes.features import global_features, patch_features, width
from vitsinks.quantize import block_outputs


@pytest.mark.parametrize("registers", [0, 2])
def test_the_probe_features_are_timms_own(registers: int) -> None:
    torch.manual_seed(0)
    model = tiny_vit(registers=registers, depth=3).eval()
    x = images(4)
    with torch.no_grad():
        out = model.forward_intermediates(x, indices=2, return_prefix_tokens=True, norm=True, output_fmt="NLC",
                                          intermediates_only=True)
        tokens = model.forward_features(x)
    cls, patch_mean = global_features(model, x, 2)
    assert torch.equal(cls, torch.stack([prefix[:, 0] for _, prefix in out], dim=1))
    assert torch.equal(patch_mean, out[-1][0].mean(1))
    grid = patch_features(adapt(model), x)
    assert grid.shape == (4, 48, 4, 4) and width(model) == 48
    assert torch.equal(grid, tokens[:, 1 + registers :].transpose(1, 2).reshape(4, 48, 4, 4))


def test_the_quantizations_block_outputs_are_the_blocks_own() -> None:
    torch.manual_seed(0)
    model = tiny_vit(registers=1).eval()
    x = images(3)
    hooked: list[torch.Tensor] = []
    handles = [b.register_forward_hook(lambda _m, _i, o: hooked.append(o)) for b in model.blocks]
    with torch.no_grad():
        final = model.forward_features(x)
    for h in handles:
        h.remove()
    got_final, got_blocks = block_outputs(adapt(model), x)
    assert torch.equal(got_final, final) and len(got_blocks) == len(hooked) == 2
    assert all(torch.equal(a, b) for a, b in zip(got_blocks, hooked, strict=True))
