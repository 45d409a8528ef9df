"""The variants (the files of the `exp` config group, `schema.exp_names`) in the order every list of them shows."""

from __future__ import annotations

from vitsinks.configs.schema import exp_names

# The gate x register study's variants (the reference's sweep): shown first, the others after them by name
STUDY_VARIANTS: tuple[str, ...] = ("base", "gate", "reg", "gate+reg")


def variant_order() -> list[str]:
    """Every variant that has a config, the study's first (`STUDY_VARIANTS`), then the rest by name."""
    names = exp_names()
    return [v for v in STUDY_VARIANTS if v in names] + [v for v in names if v not in STUDY_VARIANTS]
