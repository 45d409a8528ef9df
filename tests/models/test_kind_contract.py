"""The widened kind contract: typed settings and their checks, the registry's refusal of incomplete kinds, the
blocks' places, how the diagnostics read signed, sparse and dead heads (hand-computed matrices), and the common-mode
share where the update enters the residual stream."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from tests.helpers.tiny import tiny_vit
from vitsinks.configs.schema import load_config
from vitsinks.diagnostics import diagnose_tokens
from vitsinks.diagnostics.fields import head_fields
from vitsinks.diagnostics.head_shape import attention_shape
from vitsinks.diagnostics.summary import strongest_heads
from vitsinks.models.kinds import AttentionKind
from vitsinks.models.kinds.kind import _check_kind
from vitsinks.models.kinds.softmax import Softmax
from vitsinks.utils.errors import BadValue, ConfigError


@dataclasses.dataclass(frozen=True)
class _Knobs:
    gamma: float = -0.1
    steps: int = 2


class _Knobbed(Softmax):
    name = "knobbed"
    Settings: ClassVar[type] = _Knobs


def test_settings_are_typed_defaulted_and_unknown_names_refused() -> None:
    s = _Knobbed.settings({"gamma": "0.25"})
    assert (s.gamma, s.steps) == (0.25, 2) and isinstance(s.gamma, float)
    assert _Knobbed.settings_tag(s) == "(gamma=0.25)" and _Knobbed.settings_tag(_Knobbed.settings()) == ""
    with pytest.raises(BadValue, match=r"has no setting 'zeta' \(its settings: gamma=-0.1, steps=2\)"):
        _Knobbed.settings({"zeta": 1.0})
    with pytest.raises(BadValue, match=r"model.kind_settings.steps='many' is not a int"):
        _Knobbed.settings({"steps": "many"})
    with pytest.raises(BadValue, match="has no setting 'gamma' \\(its settings: none\\)"):
        Softmax.settings({"gamma": 1.0})


def test_a_setting_the_kind_lacks_is_refused_when_the_config_is_composed() -> None:
    with pytest.raises(ConfigError, match="attention kind 'softmax' has no setting 'gamma'"):
        load_config(["exp=base", "+model.kind_settings.gamma=0.1"])


def _kind(**attrs: Any) -> type[AttentionKind]:
    return type("Planted", (AttentionKind,), {"name": "planted", **attrs})


def _matrix(attn: Any, s: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
    return s


@pytest.mark.parametrize(("attrs", "message"), [
    ({}, "declares no matrix, redirected, reference"),
    ({"matrix": staticmethod(_matrix), "redirected": staticmethod(_matrix), "reference": staticmethod(_matrix),
      "flex": True}, "declares no flex_heads"),
    ({"matrix": staticmethod(_matrix), "redirected": staticmethod(_matrix), "reference": staticmethod(_matrix),
      "signed": True}, "signed weights do not sum to 1"),
    ({"matrix": staticmethod(_matrix), "redirected": staticmethod(_matrix), "reference": staticmethod(_matrix),
      "Settings": dataclasses.make_dataclass("Loose", [("gamma", float, -0.1)])}, "must be a frozen dataclass"),
])
def test_the_registry_refuses_an_incomplete_or_contradictory_kind(attrs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _check_kind(_kind(**attrs))


def test_every_block_knows_its_place() -> None:
    model = tiny_vit(depth=3)
    assert [(blk.attn.block, blk.attn.depth) for blk in model.blocks] == [(0, 3), (1, 3), (2, 3)]
    assert len({type(blk.attn) for blk in model.blocks}) == 1  # one attention class, placed per instance


def test_dead_and_negative_shares_and_magnitudes_on_hand_matrices() -> None:
    dead = torch.zeros(1, 1, 3, 3)
    signed = torch.tensor([[0.5, -0.25, 0.75], [0.0, 1.0, -1.0], [0.25, 0.25, 0.5]]).view(1, 1, 3, 3)
    got = attention_shape(torch.cat([dead, signed], dim=1))
    assert got["dead"].tolist() == [[1.0, 0.0]]
    assert torch.isnan(got["neg_mass"][0, 0]) and torch.isnan(got["concentration"][0, 0])
    total = 0.5 + 0.25 + 0.75 + 1.0 + 1.0 + 0.25 + 0.25 + 0.5
    assert got["neg_mass"][0, 1].item() == pytest.approx(1.25 / total)
    cols = [0.5 + 0.0 + 0.25, 0.25 + 1.0 + 0.25, 0.75 + 1.0 + 0.5]  # column sums of |A|
    assert got["concentration"][0, 1].item() == pytest.approx(max(cols) / sorted(cols)[1])
    assert got["diag_mass"][0, 1].item() == pytest.approx((0.5 + 1.0 + 0.5) / 3)


def test_a_strongly_negative_column_is_a_sink_of_a_signed_head_only() -> None:
    a = torch.tensor([[0.3, -0.9, 0.4], [0.2, -0.95, 0.5], [0.35, -0.92, 0.3]]).view(1, 1, 3, 3)
    v = torch.randn(1, 1, 3, 4, generator=torch.Generator().manual_seed(0))
    w_o = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    signed = head_fields(a, v, w_o, None, signed=True)
    plain = head_fields(a, v, w_o, None)
    assert signed["sink_idx"].item() == 1 and plain["sink_idx"].item() != 1
    assert signed["mass"].item() == pytest.approx((0.9 + 0.95 + 0.92) / 3)
    assert signed["routed_frac"].item() == 1.0 and signed["min_a"].item() == pytest.approx(0.9)


def test_a_block_of_dead_heads_reads_dead_not_a_sink_at_cls() -> None:
    shape = (2, 2, 3)  # images, blocks, heads
    d = {"mass": np.zeros(shape), "sink_idx": np.zeros(shape, dtype=int), "ratio_out": np.full(shape, 0.1),
         "dead": np.zeros(shape), "num_registers": np.array(0), "num_patches": np.array(4),
         "extra_keys": np.array([], dtype=str)}
    d["dead"][:, 1] = 1.0  # every head of block 1, on every image
    d["mass"][:, 0, 2] = 0.4
    d["sink_idx"][:, 0, 2] = 3
    out = strongest_heads(d)
    assert out["location"] == ["patch", "dead"] and out["head"][0] == 2 and out["mass"][1] == 0.0


class _Centre(torch.nn.Module):
    """An update-site module that removes the update's mean over tokens (its common mode)."""

    def add_to(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return o - o.mean(dim=1, keepdim=True)


def test_the_common_mode_share_is_read_where_the_update_enters_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_vit(depth=1).eval()
    blk = model.blocks[0]
    with torch.no_grad():
        blk.attn.proj.bias.fill_(1.0)  # a large common mode in the attention's own update
    x = model.embed_tokens(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    before = diagnose_tokens([blk], x)
    assert (before["cm_num"] / before["cm_den"]).min() > 0.5
    monkeypatch.setattr(blk, "_update_modules", lambda: [_Centre()])
    after = diagnose_tokens([blk], x)
    assert (after["cm_num"] / after["cm_den"]).max() < 1e-5  # removed before it reaches the stream (float32)
    np.testing.assert_array_equal(after["update_share"], before["update_share"])  # the heads' shares: unchanged
