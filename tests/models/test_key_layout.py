"""The key layout without a [CLS] token (`KeyLayout(cls=0)`, e.g. SigLIP) and its readers, against layouts written
out by hand: positions, locations, the fields round trip, and the code that reads token positions off a layout (the
summary's location, the interventions' register edits, the page's prefix shares, the plots' labels)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from vitsinks.diagnostics.page import _attn_tile, _norm_tile, image_maps
from vitsinks.diagnostics.plots import _where
from vitsinks.diagnostics.summary import layout_of, location, token_location
from vitsinks.interventions.edits import register_control
from vitsinks.models.layout import KeyLayout
from vitsinks.models.seam import Backbone
from vitsinks.utils.errors import BadValue

# keys: registers 0, 1 | patches 2..5 | null key 6 (no [CLS])
NO_CLS = KeyLayout(2, 4, ("null",), cls=0)
# keys: [CLS] 0 | registers 1, 2 | patches 3..6 | null key 7
WITH_CLS = KeyLayout(2, 4, ("null",))


def test_a_layout_without_cls_starts_with_its_registers() -> None:
    assert (NO_CLS.num_prefix, NO_CLS.n_tokens, NO_CLS.n_keys) == (2, 6, 7)
    assert NO_CLS.register_slice == slice(0, 2) and NO_CLS.patch_slice == slice(2, 6)
    assert NO_CLS.locations == ("cls", "register", "patch", "null")  # the codes mean the same in every layout
    assert NO_CLS.location_code(np.arange(7)).tolist() == [1, 1, 2, 2, 2, 2, 3]
    assert NO_CLS.location(np.arange(7)).tolist() == ["register"] * 2 + ["patch"] * 4 + ["null"]
    assert NO_CLS.is_token(np.arange(7)).tolist() == [True] * 6 + [False]


def test_without_cls_or_registers_key_zero_is_a_patch() -> None:
    siglip = KeyLayout(0, 4, cls=0)
    assert siglip.num_prefix == 0 and siglip.patch_slice == slice(0, 4) and siglip.register_slice == slice(0, 0)
    assert siglip.location(np.arange(4)).tolist() == ["patch"] * 4
    assert token_location(np.arange(3), 0, num_cls=0).tolist() == [2, 2, 2]


def test_a_layout_with_cls_is_unchanged() -> None:
    assert (WITH_CLS.cls, WITH_CLS.num_prefix, WITH_CLS.n_tokens, WITH_CLS.n_keys) == (1, 3, 7, 8)
    assert WITH_CLS.register_slice == slice(1, 3) and WITH_CLS.patch_slice == slice(3, 7)
    assert WITH_CLS.location_code(np.arange(8)).tolist() == [0, 1, 1, 2, 2, 2, 2, 3]
    assert token_location(np.arange(5), 2).tolist() == [0, 1, 1, 2, 2]


def test_fields_round_trip_and_num_cls_only_when_not_one() -> None:
    assert "num_cls" not in WITH_CLS.fields()  # the files of models with a [CLS] stay byte-identical
    f = NO_CLS.fields()
    assert int(f["num_cls"]) == 0 and int(f["num_prefix"]) == 2
    for layout in (NO_CLS, WITH_CLS, KeyLayout(0, 9, cls=0)):
        assert KeyLayout.from_fields(layout.fields()) == layout
    # a file without a patch count: the tokens give it, net of the [CLS] (if any) and the registers
    assert KeyLayout.from_fields({"num_registers": 2, "num_cls": 0}, n_tokens=6) == KeyLayout(2, 4, cls=0)
    assert KeyLayout.from_fields({"num_registers": 2}, n_tokens=6) == KeyLayout(2, 3)
    assert KeyLayout.from_fields({"num_cls": 0, "sink_idx": np.array([[0, 5]])}) == KeyLayout(0, 6, cls=0)


def test_more_than_one_cls_is_a_clear_error() -> None:
    with pytest.raises(BadValue, match="0 or 1 \\[CLS\\]"):
        KeyLayout(0, 4, cls=2)
    with pytest.raises(BadValue, match="0 or 1 \\[CLS\\]"):
        Backbone(nn.Identity(), "test", [], lambda x: x, lambda x: x, num_cls=2)


def test_summary_location_of_a_no_cls_diagnosis() -> None:
    d = {**KeyLayout(1, 4, cls=0).fields(), "sink_idx": np.array([[[0, 1, 4]]])}
    assert layout_of(d) == KeyLayout(1, 4, cls=0)
    assert location(d).tolist() == [[[1, 2, 2]]]  # key 0 is the register, not [CLS]


def test_register_edits_of_a_model_without_cls() -> None:
    x = torch.arange(2 * 5 * 1, dtype=torch.float32).view(2, 5, 1) + 1  # 2 registers, then 3 patches
    zeroed = register_control("zero_registers", x, 2, num_cls=0)
    assert zeroed[:, :2].eq(0).all() and torch.equal(zeroed[:, 2:], x[:, 2:])
    mean = torch.tensor([[7.0], [8.0]])
    assert register_control("mean_registers", x, 2, mean, num_cls=0)[:, :2, 0].tolist() == [[7, 8], [7, 8]]
    assert torch.equal(register_control("shuffle_registers", x, 2, perm=torch.tensor([1, 0]), num_cls=0)[0, :2],
                       x[1, :2])
    subject = Backbone(nn.Identity(), "test", [], lambda t: t, lambda t: t, num_registers=2, num_cls=0)
    assert torch.equal(subject.without_registers(x), x[:, 2:])
    with_cls = Backbone(nn.Identity(), "test", [], lambda t: t, lambda t: t, num_registers=2)
    assert torch.equal(with_cls.without_registers(x), x[:, [0, 3, 4]])


def test_the_page_and_the_plots_read_a_no_cls_layout() -> None:
    layout = KeyLayout(1, 4, cls=0)  # register 0 | patches 1..4, on a 2 x 2 grid
    col = np.array([0.5, 0.1, 0.2, 0.15, 0.05])
    d = {**layout.fields(), "grid": np.array([2, 2]), "attn_col_mean": col.reshape(1, 1, 1, 5),
         "token_norms": (10 * col).reshape(1, 1, 5), "sink_idx": np.array([[[0]]])}
    m = image_maps(d, [0], 0)
    a, t = m["attention"][0], m["token_norm"][0]
    assert a["cls"] is None and a["registers"] == [0.5] and a["registers_total"] == 0.5
    assert a["map"] == [[0.1, 0.2], [0.15, 0.05]] and t["registers"] == [5.0] and t["vmax"] == 2.0
    tiles = _attn_tile(a, [0.0, 0.2], (2, 2)) + _norm_tile(t, (2, 2))
    assert "[CLS]" not in tiles and "reg 0.5 · patches 0.5" in tiles and "reg max 5" in tiles
    assert _where(d, 0, 0, 0) == "register 0"
    assert _where({**d, "sink_idx": np.array([[[3]]])}, 0, 0, 0) == "patch 2"
