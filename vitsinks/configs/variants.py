"""The variants: the files of the `exp` config group (`schema.exp_names`), and the order they are shown in.

Every list of all variants (the leaderboard's row order, the bench, the tests, the variant tables of README.md and
docs/variants.md written by `python -m vitsinks.docs variants`) derives from `exp_names()`. The one
hand-kept choice is `STUDY_VARIANTS`, an experiment's design: it puts the study's variants first.
"""

from __future__ import annotations

from vitsinks.configs.schema import exp_names

# The gate x register study's variants (the reference's sweep: eval/make_leaderboard.sh, eval/emergence/, the README's
# sweep commands): shown first wherever variants are listed, the others after them by name.
STUDY_VARIANTS: tuple[str, ...] = ("base", "gate", "reg", "gate+reg")


def variant_order() -> list[str]:
    """Every variant that has a config (`vitsinks/configs/exp/*.yaml`), the study's first (`STUDY_VARIANTS`), then
    the rest by name."""
    names = exp_names()
    return [v for v in STUDY_VARIANTS if v in names] + [v for v in names if v not in STUDY_VARIANTS]
