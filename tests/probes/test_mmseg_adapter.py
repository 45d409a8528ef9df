"""The mmseg backend's pieces: the frozen backbone's maps, the stand-in for mmcv's compiled ops, and DINOv2's linear
head registered in mmseg (the extra `vitsinks[mmseg]`; CI installs it, and under CI=true these tests never skip)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from tests.helpers.requirements import require
from tests.helpers.tiny import images, tiny_vit
from vitsinks.backbones import adapt
from vitsinks.probes import mmcv_standin
from vitsinks.probes.features import patch_features
from vitsinks.probes.mmseg_adapter import VitsinksBackbone, register

require("mmseg")


def test_backbone_feature_maps() -> None:
    bb = VitsinksBackbone("vit_cpu", out_indices=(0, 2, -1), img_size=32, depth=4, embed_dim=48, num_heads=3,
                          registers=2)
    feats = bb(torch.randn(2, 3, 32, 32))
    assert [f.shape for f in feats] == [torch.Size([2, 48, 4, 4])] * 3
    assert not any(p.requires_grad for p in bb.parameters())
    # the last map is the final-norm patch tokens, registers and [CLS] dropped
    tokens = bb.vit.forward_features(torch.zeros(1, 3, 32, 32))
    torch.testing.assert_close(bb(torch.zeros(1, 3, 32, 32))[-1].flatten(2).transpose(1, 2), tokens[:, 3:])


def test_a_given_model_gives_the_native_probes_features_and_stays_frozen() -> None:
    torch.manual_seed(0)
    model = tiny_vit(registers=1).eval()
    bb = VitsinksBackbone(model=adapt(model), out_indices=(-2, -1))
    bb.train()  # the runner's train mode leaves the frozen model in evaluation mode
    assert not model.training and list(bb.parameters()) == [] and bb.state_dict() == {}
    first, last = bb(images(3))
    assert torch.equal(last, patch_features(model, images(3)))  # what the native dense probe reads
    with torch.no_grad():
        one_block = model.norm(model.blocks[0](model._pos_embed(model.patch_embed(images(3)))))
    assert torch.equal(first, one_block[:, 2:].transpose(1, 2).reshape(3, 48, 4, 4))


def test_the_stand_in_replaces_only_a_missing_compiled_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, mmcv_standin.NAME, raising=False)
    real = types.ModuleType(mmcv_standin.NAME)
    monkeypatch.setitem(sys.modules, mmcv_standin.NAME, real)  # full mmcv's compiled module, already imported
    assert not mmcv_standin.install() and sys.modules[mmcv_standin.NAME] is real
    monkeypatch.delitem(sys.modules, mmcv_standin.NAME)
    assert mmcv_standin.install()  # mmcv-lite: no compiled module to import
    ext = sys.modules[mmcv_standin.NAME]
    with pytest.raises(mmcv_standin.MissingCompiledOp, match=r"^mmcv compiled op nms_rotated is not available: .*"
                       r"install full mmcv"):
        ext.nms_rotated(torch.zeros(1, 5))
    assert hasattr(ext, "roi_align_forward")  # mmcv.ops' loader only checks that the names exist
    assert mmcv_standin.install()  # idempotent


def test_an_op_that_needs_compiled_code_ends_in_one_line() -> None:
    register()
    from mmcv.ops import nms

    with pytest.raises(mmcv_standin.MissingCompiledOp, match="mmcv compiled op nms is not available"):
        nms(torch.rand(3, 4), torch.rand(3), 0.5)


def test_the_linear_heads_are_batchnorm_and_a_1x1_convolution_over_the_maps() -> None:
    register()
    from mmseg.registry import MODELS

    assert MODELS.get("VitsinksBackbone") is VitsinksBackbone
    torch.manual_seed(0)
    maps = [torch.randn(2, 8, 4, 4), torch.randn(2, 8, 2, 2)]
    head = MODELS.build({"type": "BNHead", "in_channels": [8, 8], "in_index": [0, 1], "channels": 16,
                         "input_transform": "resize_concat", "num_classes": 5, "dropout_ratio": 0.0,
                         "norm_cfg": {"type": "BN"}}).eval()
    logits = head(maps)
    up = torch.nn.functional.interpolate(maps[1], size=(4, 4), mode="bilinear", align_corners=False)
    joined = torch.cat([maps[0], up], dim=1)  # the multi-layer variant: maps concatenated on the first map's grid
    assert torch.allclose(logits, head.conv_seg(head.bn(joined)))
    assert logits.shape == (2, 5, 4, 4) and isinstance(head.bn, torch.nn.BatchNorm2d)
    with pytest.raises(ValueError, match="channels=8 must equal the input width 16"):
        MODELS.build({"type": "BNHead", "in_channels": [8, 8], "in_index": [0, 1], "channels": 8,
                      "input_transform": "resize_concat", "num_classes": 5})
