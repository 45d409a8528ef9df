"""The command line's range checks for the Python API: an argument that sets what a config field sets is checked
against the range that field declares (`bounded`, one place per setting), in the words of `schema.check_config`,
naming the command line's key, e.g. `weight_bits=1 (must be >= 2 and <= 16; the command line's
quant.weight_bits)`."""

from __future__ import annotations

import dataclasses
import numbers
import typing
from functools import cache
from typing import Any

from vitsinks.configs.schema import Config, NumericField, numeric_fields
from vitsinks.utils.errors import BadValue


@cache
def _fields(schema: type) -> dict[str, NumericField]:
    """The numeric fields of the config dataclass `schema` (its own, not those of nested groups) by name, their keys
    those of the whole config (`quant.weight_bits`) when `schema` is one of its groups."""
    hints = typing.get_type_hints(Config)
    group = next((f.name for f in dataclasses.fields(Config) if hints[f.name] is schema), None)
    prefix = "" if schema is Config or group is None else f"{group}."
    return {nf.name: nf for nf in numeric_fields(schema, prefix) if nf.owner is schema}


def check_setting(schema: type, field: str, value: Any, name: str | None = None) -> None:
    """A `BadValue` unless `value`, the API's argument `name` (default `field`), is what the command line accepts for
    the field `field` of the config dataclass `schema`: a number (an integer for an int field) in its declared range
    (each entry of a list field's; a single number checked as one entry). None is not checked ("the default")."""
    nf = _fields(schema).get(field)
    if nf is None:
        raise TypeError(f"{schema.__name__} has no numeric field {field!r}")
    if value is None:
        return
    name = name or field
    many = isinstance(value, list | tuple)
    entries = list(value) if many else [value]
    if many and not nf.is_list or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in entries):
        raise BadValue(f"{name}={value!r}: give {'numbers' if nf.is_list else 'a number'} (the command line's "
                       f"{nf.key})")
    if nf.kind is int and not all(isinstance(v, numbers.Integral) for v in entries):
        raise BadValue(f"{name}={value!r}: give an integer (the command line's {nf.key})")
    entries = [int(v) if isinstance(v, numbers.Integral) else float(v) for v in entries]  # numpy's numbers too
    problem = nf.range.problem(name, entries if many else entries[0], many) if nf.range is not None else None
    if problem:
        raise BadValue(f"{problem.removesuffix(')')}; the command line's {nf.key})")

def check_settings(settings: object, skip: tuple[str, ...] = ()) -> None:
    """Every numeric field of the config dataclass instance `settings` (e.g. a `DiagnosticsConfig` a notebook built)
    checked as the command line checks it (`check_setting`), but those in `skip`."""
    schema: type = type(settings)
    for name in _fields(schema):
        if name not in skip:
            check_setting(type(settings), name, getattr(settings, name))


__all__ = ["check_setting", "check_settings"]
