"""The generated option page (docs/commands-options.md) against the code it is generated from."""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pytest

from vitsinks.__main__ import commands
from vitsinks.configs.schema import Config
from vitsinks.models.kinds import KINDS, AttentionKind
from vitsinks.models.mitigations import MITIGATIONS, BlockMitigation, mitigation_columns
from vitsinks.pages import options_page as docs
from vitsinks.utils.bounded import bounded

PAGE = Path(__file__).resolve().parents[2] / "docs" / "commands-options.md"

Colour = StrEnum("Colour", "red green", module=__name__)


@dataclass
class Example:
    """An example group."""

    plain: int = bounded(3, ge=1)
    # the comment above a field
    # on two lines
    above: float = bounded(0.5, gt=0, le=1)
    inline: str | None = None  # the comment beside it
    both: Colour = Colour.red  # and beside
    bare: list[float] = field(default_factory=list)


@pytest.fixture(scope="module")
def page() -> str:
    return docs.render()


@pytest.mark.slow
def test_committed_page_is_what_the_code_writes() -> None:
    """For the mitigations and attention kinds the page says it covers: one added since leaves it current."""
    assert PAGE.is_file(), f"run `{docs.GENERATOR}`"
    committed = PAGE.read_text()
    assert docs.Plugins.of_page(committed) is not None, f"the page names no plugins: run `{docs.GENERATOR}`"
    assert committed == docs.current(committed), f"docs/commands-options.md is stale: run `{docs.GENERATOR}`"


class _Throwaway(BlockMitigation):
    name = "throwaway"  # registered by a test only


class _ThrowawayKind(AttentionKind):
    name = "throwaway_kind"


@pytest.mark.slow
def test_the_generated_page_names_every_registered_plugin(page: str) -> None:
    every = docs.Plugins.registered()
    assert docs.Plugins.of_page(page) == every and every.line() in page.splitlines()
    assert "gate" in every.mitigations and {"softmax", "relu"} <= set(every.kinds)
    assert docs.Plugins.of_page(docs.Plugins((), ()).line()) == docs.Plugins((), ())


@pytest.mark.slow
def test_a_plugin_registered_after_the_page_was_written_leaves_it_current(page: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MITIGATIONS._items, _Throwaway.name, _Throwaway)
    monkeypatch.setitem(KINDS._items, _ThrowawayKind.name, _ThrowawayKind)
    assert docs.current(page) == page
    again = docs.render()  # the generator covers it
    assert docs.Plugins.of_page(again) == docs.Plugins.registered() != docs.Plugins.of_page(page)
    assert {"throwaway", "throwaway_kind"} <= set(re.findall(r"`([^`]+)`", docs.Plugins.registered().line()))


def _sets(line: str) -> str:
    """The `sets` cell of an exp option's row."""
    return line.rstrip(" |").rsplit(" | ", 1)[1]


def _switches_on_gate_or_relu(line: str) -> bool:
    return "`model.attn=relu`" in _sets(line) or re.search(r"`model\.gate=(?!none`)", _sets(line)) is not None


@pytest.mark.slow
def test_a_page_without_a_plugin_has_no_trace_of_it(page: str) -> None:
    """The page as it was before `gate` and `relu` were added: no `model.gate` row, no `relu` choice, no exp config
    that switches either on, every other line as in the full page; and it is current."""
    every = docs.Plugins.registered()
    before = docs.Plugins(tuple(m for m in every.mitigations if m != "gate"),
                          tuple(k for k in every.kinds if k != "relu"))
    old = docs.render(before)
    assert docs.current(old) == old
    attn = next(ln for ln in page.splitlines() if ln.startswith(f"| `{docs.ATTN_KEY}` |"))
    assert set(old.splitlines()) - set(page.splitlines()) == {before.line(), attn.replace(", relu", "")}
    gone = set(page.splitlines()) - set(old.splitlines()) - {every.line(), attn}
    exps = [ln for ln in gone if ln.startswith("| `exp=")]
    assert exps and all(_switches_on_gate_or_relu(ln) for ln in exps)
    assert gone - set(exps) == {next(ln for ln in page.splitlines() if ln.startswith("| `model.gate` |"))}
    assert not [ln for ln in old.splitlines() if ln.startswith("| `exp=") and _switches_on_gate_or_relu(ln)]


@pytest.mark.slow
def test_any_other_change_makes_the_page_stale(page: str) -> None:
    every = docs.Plugins.registered()
    drifted = {"prose": page.replace("Pick one option per group", "Pick an option per group"),
               "a row": page.replace("| int |", "| float |", 1),
               "a removed plugin": page.replace(every.line(), docs.Plugins((*every.mitigations, "removed"),
                                                                           every.kinds).line()),
               "a plugin not said": page.replace(every.line(), docs.Plugins(every.mitigations[1:],
                                                                            every.kinds).line()),
               "no plugin line": page.replace(every.line() + "\n\n", "")}
    assert not [why for why, text in drifted.items() if text == page]
    assert [why for why, text in drifted.items() if docs.current(text) == text] == []


def test_comments_are_read_from_the_source() -> None:
    notes = docs.field_comments(Example)
    assert notes == {"above": "the comment above a field on two lines", "inline": "the comment beside it",
                     "both": "and beside"}


def test_types_and_what_a_field_admits() -> None:
    hints = typing.get_type_hints(Example)
    by_name = {f.name: f for f in dataclasses.fields(Example)}
    assert [docs.type_name(hints[n]) for n in by_name] == ["int", "float", "str | None", "choice", "list[float]"]
    assert docs.admits(by_name["plain"], hints["plain"]) == ">= 1"
    assert docs.admits(by_name["above"], hints["above"]) == "> 0 and <= 1"
    assert docs.admits(by_name["both"], hints["both"]) == "red, green"
    assert docs.admits(by_name["inline"], hints["inline"]) == ""


def test_short_keys_are_described_with_their_shared_prefix_said_once() -> None:
    described = docs.describe_short_keys({"n": "intervene.n", "k": "intervene.k"})
    assert described == "`n=`, `k=` (each for `intervene.<key>=`)"
    assert docs.describe_short_keys({"n": "a.n", "m": "b.m"}) == "`n=` (`a.n=`), `m=` (`b.m=`)"


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        inner = next((a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)), hint)
        key = f"{prefix}{f.name}"
        out += _leaf_keys(inner, key + ".") if dataclasses.is_dataclass(inner) else [key]
    return out


@pytest.mark.slow
def test_every_field_and_command_has_a_row(page: str) -> None:
    rows = {line.split("|")[1].strip() for line in page.splitlines() if line.startswith("| `")}
    missing = [k for k in _leaf_keys(Config) if f"`{k}`" not in rows]
    assert not missing
    assert not [c for c in commands() if f"`python -m {c}`" not in rows]


def test_every_leaderboard_column_is_explained() -> None:
    """docs/evaluation.md's column table names every registered leaderboard column by its CSV key (the dense and
    Definition-1 families by their pattern), in a line that starts with the table the leaderboard shows it in; a
    block mitigation's column may instead carry its own docs line (`Column.doc`, printed under every leaderboard
    that shows it)."""
    from vitsinks.report.collect import columns
    from vitsinks.utils.results import Column

    text = (PAGE.parent / "evaluation.md").read_text()
    patterns = {"dense_": ("`dense_<data>`", "`dense_<data>_kempner`", "`dense_<data>_kempner_cached`"),
                "def1_": ("`def1_<eps>`",)}
    rows = [r for r in text.splitlines() if r.startswith("| ")]

    def line(c: Column) -> str | None:
        forms = next((f for p, f in patterns.items() if c.key.startswith(p)), (f"`{c.key}`",))
        return next((r for r in rows if forms[0] in r), None) if all(f in text for f in forms) else None

    own = {c.key for c in mitigation_columns() if c.doc}  # a mitigation's column is explained by its own docs line
    missing = [c.key for c in columns() if line(c) is None and c.key not in own]
    assert not missing, f"leaderboard columns without a line in docs/evaluation.md: {missing}"
    misplaced = [c.key for c in columns() if line(c) is not None and line(c).split("|")[1].strip() != c.table]
    assert not misplaced, f"docs/evaluation.md names another leaderboard table for: {misplaced}"
