"""A variant's name: its attention kind, then the tags of its registers and mitigations in `TAG_ORDER`, the one
place their order is set (committed run names depend on it)."""

from __future__ import annotations

from typing import Any

import pytest

from vitsinks.models import MITIGATIONS, variant_name
from vitsinks.models.config import TAG_ORDER
from vitsinks.models.mitigations import BlockMitigation


def test_the_tags_follow_the_kind_in_tag_order() -> None:
    every = {"attn": "relu", "global_pathway": {"enabled": True}, "registers": 2, "gate": "headwise"}
    assert variant_name(every) == "relu+gate_headwise+reg2+global"
    assert variant_name({"global_pathway": {"enabled": True}, "registers": 4, "gate": "elementwise"}) == \
        "gate+reg+global"
    assert TAG_ORDER.index("gate") < TAG_ORDER.index("registers") < TAG_ORDER.index("global_pathway")


class Extra(BlockMitigation):
    """A mitigation that `TAG_ORDER` does not list."""

    name = "extra"

    @classmethod
    def setting(cls, value: Any) -> bool | None:
        return True if value else None

    @classmethod
    def tag(cls, setting: bool | None) -> str | None:
        return "extra" if setting else None


def test_a_mitigation_that_tag_order_does_not_list_comes_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MITIGATIONS._items, "extra", Extra)  # registered without the checks of `register`
    assert "extra" not in TAG_ORDER
    assert variant_name({"extra": True, "gate": "elementwise", "registers": 4, "attn": "softpick"}) == \
        "softpick+gate+reg+extra"
    assert variant_name({"extra": True}) == "extra" and variant_name({"extra": False}) == "base"
