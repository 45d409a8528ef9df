"""Ranges as dataclass field metadata."""

from __future__ import annotations

import dataclasses
import math

import pytest

from vitsinks.utils.bounded import Range, bounded, range_of


def test_a_range_admits_finite_numbers_inside_its_bounds_only() -> None:
    r = Range(ge=0, lt=1)
    assert r.admits(0) and r.admits(0.999) and not r.admits(1) and not r.admits(-1e-9)
    assert not r.admits(math.nan) and not Range().admits(math.inf) and Range().admits(-5)
    assert not Range(ge=0).admits(True)  # a boolean is not a number here
    assert Range(gt=0, le=0.5).describe() == "> 0 and <= 0.5" and Range().describe() == "finite"


def test_two_bounds_on_one_side_are_refused() -> None:
    with pytest.raises(TypeError):
        Range(ge=0, gt=0)


def test_bounded_makes_a_dataclass_field_with_its_default_and_range() -> None:
    @dataclasses.dataclass
    class C:
        n: int = bounded(3, ge=1)
        xs: list[float] = bounded(factory=lambda: [0.5], gt=0, le=1)
        plain: int = 0

    c, fields = C(), {f.name: f for f in dataclasses.fields(C)}
    assert (c.n, c.xs) == (3, [0.5]) and C().xs is not c.xs
    assert range_of(fields["n"]) == Range(ge=1) and range_of(fields["xs"]) == Range(gt=0, le=1)
    assert range_of(fields["plain"]) is None


def test_bounded_keeps_other_metadata_beside_the_range() -> None:
    @dataclasses.dataclass
    class C:
        p: float = bounded(0.0, ge=0, metadata={"other": False})

    (f,) = dataclasses.fields(C)
    assert f.metadata["other"] is False and range_of(f) == Range(ge=0)
