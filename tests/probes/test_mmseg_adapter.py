"""The optional mmsegmentation adapter: what can be checked without mmcv's compiled ops."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vitsinks.probes.mmseg_adapter import VitsinksBackbone, register

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "vitsinks" / "configs" / "mmseg").glob("vitsinks_*.py"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_configs_load_with_mmengine(path: Path) -> None:
    mmengine_config = pytest.importorskip("mmengine.config")
    cfg = mmengine_config.Config.fromfile(str(path))
    assert cfg.model.backbone.type == "VitsinksBackbone"
    assert cfg.model.decode_head.num_classes == (150 if "ade20k" in path.stem else 21)
    assert cfg.model.data_preprocessor.type == "SegDataPreProcessor"
    assert cfg.custom_imports.imports == ["vitsinks.probes.mmseg_adapter"]
    head = cfg.model.decode_head.type
    assert head == ("UPerHead" if "upernet" in path.stem else "FCNHead")
    assert len(CONFIGS) == 4


def test_backbone_feature_maps() -> None:
    bb = VitsinksBackbone("vit_cpu", out_indices=(0, 2, -1), img_size=32, depth=4, embed_dim=48, num_heads=3,
                          registers=2)
    feats = bb(torch.randn(2, 3, 32, 32))
    assert [f.shape for f in feats] == [torch.Size([2, 48, 4, 4])] * 3
    assert not any(p.requires_grad for p in bb.parameters())
    # the last map is the final-norm patch tokens, registers and [CLS] dropped
    tokens = bb.vit.forward_features(torch.zeros(1, 3, 32, 32))
    torch.testing.assert_close(bb(torch.zeros(1, 3, 32, 32))[-1].flatten(2).transpose(1, 2), tokens[:, 3:])


def test_register_without_mmcv_ops_says_why_and_what_to_use() -> None:
    try:
        import mmcv.ops  # noqa: F401
    except Exception:  # noqa: BLE001
        with pytest.raises(ImportError, match="native dense probe instead: python -m vitsinks.eval.dense"):
            register()
    else:  # a stack with working mmcv ops: registration must succeed
        from mmseg.registry import MODELS

        register()
        assert MODELS.get("VitsinksBackbone") is VitsinksBackbone
