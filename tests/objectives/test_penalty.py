"""The common-mode penalty's hooks: what they record and when (its numbers: tests/models/test_pathway.py)."""

from __future__ import annotations

import pytest
import torch

from vitsinks.configs.schema import ObjectiveConfig
from vitsinks.models import build_vit
from vitsinks.objectives.penalty import CommonModePenalty


def test_only_forward_passes_with_gradients_are_recorded_and_each_is_averaged() -> None:
    torch.manual_seed(0)
    model = build_vit("vit_cpu", img_size=32, depth=2)
    penalty = CommonModePenalty(model.blocks, ObjectiveConfig(cm_penalty=1.0))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        model(x)
    with pytest.raises(RuntimeError, match="before a forward pass with gradients"):
        penalty()
    model(x)
    once = penalty()[1]
    model(x), model(x)  # the same input twice: the mean of two equal terms
    twice = penalty()[1]
    assert all(torch.allclose(once[k], twice[k]) for k in once)
    with pytest.raises(RuntimeError):  # reading resets
        penalty()


def test_pre_gate_penalises_the_update_before_the_gate() -> None:
    torch.manual_seed(0)
    model = build_vit("vit_cpu", img_size=32, depth=1, gate="elementwise")
    with torch.no_grad():
        model.blocks[0].attn.gate.weight.normal_()  # a gate that changes the update
    x = torch.randn(2, 3, 32, 32)
    after = CommonModePenalty(model.blocks, ObjectiveConfig(cm_penalty=1.0))
    before = CommonModePenalty(model.blocks, ObjectiveConfig(cm_penalty=1.0, cm_pre_gate=True))
    model(x)
    a, b = after()[1]["cm/block0"], before()[1]["cm/block0"]
    assert not torch.isclose(a, b)


def test_removed_hooks_record_nothing_and_leave_the_forward_unchanged() -> None:
    torch.manual_seed(0)
    model = build_vit("vit_cpu", img_size=32, depth=2)
    x = torch.randn(2, 3, 32, 32)
    plain = model(x)
    penalty = CommonModePenalty(model.blocks, ObjectiveConfig(cm_penalty=1.0))
    torch.testing.assert_close(model(x), plain)  # hooks observe, never change
    penalty.reset()
    penalty.remove()
    model(x)
    with pytest.raises(RuntimeError):
        penalty()


def test_skipping_every_block_is_refused() -> None:
    model = build_vit("vit_cpu", img_size=32, depth=2)
    with pytest.raises(ValueError, match=r"cm_skip_blocks=2 leaves no block to penalise .*use 0\.\.1"):
        CommonModePenalty(model.blocks, ObjectiveConfig(cm_penalty=1.0, cm_skip_blocks=2))
