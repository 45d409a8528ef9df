"""docs/fidelity.md's fidelity table: every row says what vitsinks does against the reference, in one of the stated
forms, and every test it names exists. A preset cell is `same (tested: <test ids>)`, `differs: ...` or `not matched:
...`; a default cell is `as the preset`, `same (tested: <test ids>)`, `differs: ...`, `not matched: ...` or `-`. No
cell says "same" without a test behind it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "fidelity.md"
SECTION = "## The fidelity table"
HEADER = ["element", "the reference", "vitsinks, reference preset", "vitsinks, default"]
TESTED = "same (tested: "
PRESET_FORMS = (TESTED, "differs: ", "not matched: ")
DEFAULT_FORMS = ("as the preset", TESTED, "differs: ", "not matched: ")
TEST_ID = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")
CELL_SPLIT = re.compile(r"(?<!\\)\|")  # a cell's own pipes are escaped


def table(text: str) -> list[list[str]]:
    """The rows of the first table after the section heading, each a list of stripped cells (header included)."""
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    lines = body.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in CELL_SPLIT.split(line.strip()[1:-1])])
    return rows


def missing_test(test_id: tuple[str, str], root: Path = ROOT) -> str | None:
    """Why the test `path::name` does not exist under `root` (None if it does: the file defines `def name(`)."""
    path, name = test_id
    file = root / path
    if not file.is_file():
        return f"{path}::{name}: no such file"
    if not re.search(rf"^(?:async )?def {name}\(", file.read_text(), re.M):
        return f"{path}::{name}: {path} defines no such test"
    return None


def problems(text: str, root: Path = ROOT) -> list[str]:
    """Everything in the fidelity table of `text` that breaks the page's forms, each with its row."""
    rows = table(text)
    out = [] if rows[0] == HEADER else [f"header {rows[0]} is not {HEADER}"]
    if rows[1:2] and not all(set(c) <= set("-: ") for c in rows[1]):
        out.append("the second line is not the table's delimiter row")
    body = rows[2:]
    if not body:
        out.append("the table has no rows")
    for row in body:
        name = row[0] if row else "?"
        if len(row) != len(HEADER):
            out.append(f"{name}: {len(row)} cells, not {len(HEADER)}")
            continue
        _, _, preset, default = row
        if not preset.startswith(PRESET_FORMS):
            out.append(f"{name}: the preset cell starts neither with {' nor '.join(map(repr, PRESET_FORMS))}")
        if default != "-" and not default.startswith(DEFAULT_FORMS):
            out.append(f"{name}: the default cell starts neither with {' nor '.join(map(repr, DEFAULT_FORMS))}"
                       " nor is '-'")
        for which, cell in (("preset", preset), ("default", default)):
            if cell.lower().startswith("same") and not cell.startswith(TESTED):
                out.append(f"{name}: the {which} cell says 'same' without a test")
            elif cell.startswith(TESTED):
                named = cell[len(TESTED):].split(")", 1)[0]
                if not TEST_ID.search(named):
                    out.append(f"{name}: the {which} cell's '(tested: ...)' names no test (path.py::test_name)")
    for test_id in dict.fromkeys(TEST_ID.findall(text.split(SECTION, 1)[1].split("\n## ", 1)[0])):
        why = missing_test(test_id, root)
        if why:
            out.append(why)
    return out


def test_every_row_of_the_fidelity_table_is_tested_or_names_its_difference() -> None:
    text = PAGE.read_text()
    assert not problems(text), "\n".join(problems(text))
    rows = table(text)[2:]
    assert len(rows) >= 30 and len({r[0] for r in rows}) == len(rows)  # one row per element
    named = TEST_ID.findall(text.split(SECTION, 1)[1])
    assert ("tests/test_fidelity_rows.py", "test_the_analyses_run_in_fp32_without_autocast") in named


def _page(*rows: str) -> str:
    head = "| " + " | ".join(HEADER) + " |\n|---|---|---|---|\n"
    return f"# t\n\n{SECTION}\n\nText.\n\n{head}" + "".join(f"{r}\n" for r in rows) + "\n## Next\n"


def test_the_check_fails_on_a_same_without_a_test_and_on_a_test_that_does_not_exist() -> None:
    good = "| a | r | same (tested: `tests/test_fidelity_doc.py::test_the_check_fails_on_a_same_without_a_test_" \
           "and_on_a_test_that_does_not_exist`) | as the preset |"
    assert problems(_page(good)) == []
    assert problems(_page("| b | r | differs: x, 2%, y | - |")) == []
    assert problems(_page("| c | r | same | as the preset |")) == ["c: the preset cell starts neither with "
                                                                 "'same (tested: ' nor 'differs: ' nor 'not matched: '",
                                                                 "c: the preset cell says 'same' without a test"]
    assert problems(_page("| d | r | differs: x, 1, y | same, by construction |"))[-1] == \
        "d: the default cell says 'same' without a test"
    assert problems(_page("| e | r | same (tested: by hand) | - |")) == [
        "e: the preset cell's '(tested: ...)' names no test (path.py::test_name)"]
    assert problems(_page("| f | r | same (tested: `tests/test_fidelity_doc.py::test_nothing`) | - |")) == [
        "tests/test_fidelity_doc.py::test_nothing: tests/test_fidelity_doc.py defines no such test"]
    assert problems(_page("| g | r | same (tested: `tests/nowhere.py::test_x`) | - |")) == [
        "tests/nowhere.py::test_x: no such file"]
    assert problems(_page("| h | r | differs: x | maybe |")) == [
        "h: the default cell starts neither with 'as the preset' nor 'same (tested: ' nor 'differs: ' nor "
        "'not matched: ' nor is '-'"]
    assert problems(_page("| i | r | differs: x |")) == ["i: 3 cells, not 4"]
