"""The concatenated-patches pooling of the linear probe (`cls+patches`, the `patches` protocol): [CLS] of the last
blocks with the last block's patch tokens average-pooled to a fixed grid and concatenated cell by cell, checked
against a hand computation on the tiny ViT and end to end through `python -m vitsinks.eval.linear`; the DINOv2
protocol reads what it read before."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.commands import run_command
from tests.helpers.tiny import TINY, tiny_vit, trained
from vitsinks.probes.features import global_features, linear_features
from vitsinks.probes.linear_grid import LinearGrid, train_grid
from vitsinks.probes.linear_protocols import DEFAULT_LINEAR, LINEAR_PROTOCOLS, POOLS, LinearProtocol
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue


def hand_grid(tokens: torch.Tensor, prefix: int, rows: int, side: int) -> torch.Tensor:
    """The concatenated patches by hand: final-norm tokens (B, N, D) -> the patch map, each of the side x side cells
    (rows floor(i*n/side) to ceil((i+1)*n/side), likewise columns) averaged, the cells in row-major order."""
    patches = tokens[:, prefix:]
    B, P, D = patches.shape
    fmap = patches.reshape(B, rows, P // rows, D)
    cells = []
    for i in range(side):
        for j in range(side):
            r0, r1 = i * rows // side, math.ceil((i + 1) * rows / side)
            c0, c1 = j * fmap.shape[2] // side, math.ceil((j + 1) * fmap.shape[2] / side)
            cells.append(fmap[:, r0:r1, c0:c1].mean((1, 2)))
    return torch.cat(cells, dim=1)


@pytest.mark.parametrize(("registers", "side", "size"), [(4, 2, 32), (32, 2, 32), (0, 3, 32), (4, 2, 64)])
def test_the_concatenated_patches_are_the_hand_computed_cell_means(registers: int, side: int, size: int) -> None:
    torch.manual_seed(0)
    model = tiny_vit(registers=registers).eval()
    x = torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tokens = model.forward_features(x)  # final-norm [CLS], registers, patches
    cls, patch_mean, grid = linear_features(model, x, 2, side)
    assert grid.shape == (3, side * side * 48)  # the same size at 32 and 64 px
    torch.testing.assert_close(grid, hand_grid(tokens, 1 + registers, size // 8, side), rtol=0, atol=1e-6)
    assert torch.equal(cls[:, -1], tokens[:, 0])  # [CLS], not a register
    want_cls, want_mean = global_features(model, x, 2)
    assert torch.equal(cls, want_cls) and torch.equal(patch_mean, want_mean)
    assert linear_features(model, x, 2)[2].shape == (3, 0)  # no grid asked: none computed


def test_the_patches_protocol_reads_them_and_the_dinov2_protocol_is_unchanged() -> None:
    dinov2 = LINEAR_PROTOCOLS[DEFAULT_LINEAR]
    assert dinov2.pools == ("cls", "cls+avgpool") and dinov2.grid == 0  # DINOv2's two pools, no patch grid
    patches = LINEAR_PROTOCOLS["patches"]
    assert patches.pools == ("cls+patches",) and patches.grid == 2 and "cls+patches" in POOLS
    assert LinearProtocol("mine", "mine").pools == ("cls", "cls+avgpool")  # a new protocol's default: DINOv2's
    with pytest.raises(ValueError, match="patch_grid must be >= 1"):
        LinearProtocol("bad", "bad", pools=("cls+patches",), patch_grid=0)
    grid = LinearGrid(48, 5, [0.1], [1, 2], patches.pools, patch_width=4 * 48)
    assert [h.in_features for h in grid.heads] == [48 + 4 * 48, 2 * 48 + 4 * 48]
    with pytest.raises(BadValue, match="the cls\\+patches pool reads the concatenated patches"):
        grid(torch.zeros(2, 2, 48), torch.zeros(2, 48))


def test_only_the_patches_protocol_learns_a_label_that_only_the_patch_grid_carries() -> None:
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 64, generator=g) * 4

    def feats(n: int) -> dict[str, torch.Tensor]:
        y = torch.randint(0, 4, (n,), generator=g)
        grid = centers[y] + 0.3 * torch.randn(n, 64, generator=g)
        grid = grid - grid.reshape(n, 4, 16).mean(1).repeat(1, 4)  # the cells' mean (the patch mean) carries nothing
        return {"cls": torch.randn(n, 2, 16, generator=g).half(), "patch_mean": torch.randn(n, 16, generator=g).half(),
                "patches": grid.half(), "label": y}

    train, val = feats(400), feats(200)
    got = train_grid(train, val, 4, [1e-2, 1e-1], [1, 2], 5, 64, protocol=LINEAR_PROTOCOLS["patches"])
    assert {c["pool"] for c in got} == {"cls+patches"} and got[0]["top1"] == 100.0
    dinov2 = train_grid(train, val, 4, [1e-2, 1e-1], [1, 2], 5, 64)
    assert {c["pool"] for c in dinov2} == {"cls", "cls+avgpool"} and dinov2[0]["top1"] < 60.0
    without = {k: v for k, v in train.items() if k != "patches"}  # the features the DINOv2 protocol caches
    assert train_grid(without, val, 4, [1e-2, 1e-1], [1, 2], 5, 64) == dinov2  # the extra key changes nothing


@pytest.mark.slow
def test_eval_linear_with_the_patches_protocol_end_to_end(runs: Path) -> None:
    ckpt = trained(runs, "pp")
    out = run_command([sys.executable, "-m", "vitsinks.eval.linear", f"ckpt={ckpt}", *TINY, "eval.max_train_images=48",
                       "eval.max_val_images=16", "eval.linear_epochs=2", "eval.linear_protocol=patches",
                       "eval.knn=false"])
    assert out.returncode == 0, out.stderr[-3000:]
    results = runs / "pp" / "results"
    result = json.loads((results / "linear_patches.json").read_text())
    assert not (results / "linear.json").exists()  # the default protocol's result is not touched
    assert result["protocol"] == "patches" and (result["train_images"], result["val_images"]) == (48, 16)
    assert {c["pool"] for c in result["grid"]} == {"cls+patches"} and {c["n_last"] for c in result["grid"]} == {1, 2}
    assert len(result["grid"]) == 6 * 2 and result["best"]["top1"] == max(c["top1"] for c in result["grid"])
    assert "cls+patches); " in out.stdout
    # the cached features: [CLS] of the last 2 blocks, and the 2 x 2 grid of the 4 x 4 patch map, whose four cells
    # average to the mean patch token the same forward cached (fp16 both)
    caches = [files.read_torch(p, "") for p in sorted((runs / "pp" / "eval_cache").glob("lin-*.pt"))]
    assert sorted(len(c["label"]) for c in caches) == [16, 48]
    for c in caches:
        assert c["cls"].shape[1:] == (2, 48) and c["patches"].shape[1:] == (4 * 48,)
        torch.testing.assert_close(c["patches"].float().reshape(-1, 4, 48).mean(1), c["patch_mean"].float(),
                                   rtol=0, atol=2e-3)
