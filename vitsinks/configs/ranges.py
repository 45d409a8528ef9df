"""The command line's range checks for the Python API: an argument that sets a config field is checked against the
range that field declares, naming the command line's key (`weight_bits=1 (must be >= 2 and <= 16; the command
line's quant.weight_bits)`)."""

from __future__ import annotations

import dataclasses
import numbers
import typing
from functools import cache
from typing import Any

from vitsinks.configs.checks import NumericField, numeric_fields
from vitsinks.configs.schema import Config
from vitsinks.utils.errors import BadValue


@cache
def _fields(schema: type) -> dict[str, NumericField]:
    """The own numeric fields of the config dataclass `schema` by name, keyed as in the whole config."""
    hints = typing.get_type_hints(Config)
    group = next((f.name for f in dataclasses.fields(Config) if hints[f.name] is schema), None)
    prefix = "" if schema is Config or group is None else f"{group}."
    return {nf.name: nf for nf in numeric_fields(schema, prefix) if nf.owner is schema}


def check_setting(schema: type, field: str, value: Any, name: str | None = None) -> None:
    """A `BadValue` unless `value`, the API's argument `name` (default `field`), is what the command line accepts for
    the field `field` of the config dataclass `schema` (a single number for a list field is one entry); None is
    not checked."""
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
    """Every numeric field of the config dataclass instance `settings` but those in `skip` (`check_setting`)."""
    schema: type = type(settings)
    for name in _fields(schema):
        if name not in skip:
            check_setting(schema, name, getattr(settings, name))
