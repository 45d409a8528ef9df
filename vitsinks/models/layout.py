"""The key layout of an attention row, the one reading every consumer shares (docs/extending.md, "The key layout"):

    [CLS] (1, or 0 for a model without one) | registers (R) | patches (P) | extra key slots (E)

The extra slots are keys that are no token (a keys-site mitigation's, then a kind's null key); a sink there is located
at its slot, never as a patch. Without a [CLS] the location codes keep their meaning (code 0, "cls", never occurs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from vitsinks.utils.errors import BadValue

TOKEN_LOCATIONS: tuple[str, ...] = ("cls", "register", "patch")
NULL_SLOT = "null"  # the name of an attention kind's null key


@dataclass(frozen=True)
class KeyLayout:
    """`cls` [CLS] tokens (1, or 0), `registers`, `patches`, then the named `extra` key slots, in this order."""

    registers: int
    patches: int
    extra: tuple[str, ...] = ()
    cls: int = 1

    def __post_init__(self) -> None:
        if self.cls not in (0, 1):
            raise BadValue(f"a key layout has 0 or 1 [CLS] tokens, not {self.cls}")

    @property
    def num_prefix(self) -> int:
        """[CLS] (if any) and the registers."""
        return self.cls + self.registers

    @property
    def n_tokens(self) -> int:
        """Tokens (queries): [CLS] (if any), registers, patches."""
        return self.num_prefix + self.patches

    @property
    def n_keys(self) -> int:
        """Keys: the tokens and the extra slots."""
        return self.n_tokens + len(self.extra)

    @property
    def register_slice(self) -> slice:
        """The registers' key positions (after the [CLS], if any)."""
        return slice(self.cls, self.num_prefix)

    @property
    def patch_slice(self) -> slice:
        """The patches' key positions."""
        return slice(self.num_prefix, self.n_tokens)

    @property
    def locations(self) -> tuple[str, ...]:
        """The location names in code order: [CLS] (kept without one), register, patch, each distinct extra slot."""
        return (*TOKEN_LOCATIONS, *dict.fromkeys(self.extra))

    def location_code(self, index: np.ndarray | int) -> np.ndarray:
        """Codes into `locations` of key positions: 0 [CLS], 1 register, 2 patch, 3.. the extra slots."""
        index = np.asarray(index)
        code = np.where(index < self.num_prefix, 1, 2)
        if self.cls:
            code = np.where(index == 0, 0, code)
        for j, name in enumerate(self.extra):
            code = np.where(index == self.n_tokens + j, self.locations.index(name), code)
        return code

    def location(self, index: np.ndarray | int) -> np.ndarray:
        """Location names of key positions (see `locations`)."""
        return np.asarray(self.locations, dtype=object)[self.location_code(index)]

    def is_token(self, index: np.ndarray | int) -> np.ndarray:
        """Whether key positions are tokens (not an extra slot)."""
        return np.asarray(index) < self.n_tokens

    def fields(self) -> dict[str, np.ndarray]:
        """The layout as arrays for a diagnostics file (`from_fields` reads them back); `num_cls` only when not 1."""
        return {"num_registers": np.array(self.registers), "num_prefix": np.array(self.num_prefix),
                "num_patches": np.array(self.patches), "extra_keys": np.array(self.extra, dtype=str),
                **({"num_cls": np.array(self.cls)} if self.cls != 1 else {})}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any], n_tokens: int | None = None) -> KeyLayout:
        """The layout of a diagnostics file (`fields`; older files: no extra slots, one [CLS], the patch count from
        `num_patches`, else the token count `n_tokens`, else `grid`)."""
        num_cls = int(d.get("num_cls", 1))
        registers = int(d.get("num_registers", 0))
        extra = tuple(str(e) for e in np.asarray(d["extra_keys"]).ravel()) if "extra_keys" in d else ()
        if "num_patches" in d:
            patches = int(d["num_patches"])
        elif n_tokens is not None:
            patches = n_tokens - num_cls - registers
        elif "grid" in d:
            patches = int(np.prod(d["grid"]))
        elif not extra and "sink_idx" in d:  # fields without a layout: every key past the registers is a patch
            patches = max(0, int(np.max(d["sink_idx"], initial=0)) + 1 - num_cls - registers)
        else:
            raise ValueError("the diagnostics hold no patch count (num_patches, res_norm, grid)")
        return cls(registers, patches, extra, num_cls)
