"""Write the sink-task tables of docs/studies.md ("Sink tasks with a known answer", "Causal edits on the sink tasks")
from the committed sink-task leaderboard, eval/sinktasks/leaderboard/leaderboard.md: each table of those sections
whose header names leaderboard columns gets the leaderboard's cells of those columns, its rows named `<task> /
<variant>` (nop, broadcast), a std of 0 left unsaid. tests/test_committed.py fails while a table differs from what
this writes.
    python eval/sinktasks/tables.py            # rewrites docs/studies.md in place
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOARD = ROOT / "eval" / "sinktasks" / "leaderboard" / "leaderboard.md"
PAGE = ROOT / "docs" / "studies.md"
SECTIONS = ("## Sink tasks with a known answer", "## The embedded default leaderboard")  # from, up to
CELL = re.compile(r"(?<!\\)\|")
TASKS = ("nop", "broadcast")  # the page's row order: the NOP task's variants first


def _cells(line: str) -> list[str]:
    return [c.strip() for c in CELL.split(line.strip()[1:-1])]


def board_columns(board: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """(the rows in the leaderboard's order, {column label: {row: cell}}) over every table of the leaderboard."""
    rows: list[str] = []
    columns: dict[str, dict[str, str]] = {}
    header: list[str] | None = None
    for line in board.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            row = re.sub(r"^sinktask_", "", cells[0])
            if row.split(" / ")[0] not in TASKS:  # the reference numbers' table
                continue
            if row not in rows:
                rows.append(row)
            for label, cell in zip(header[1:], cells[1:], strict=True):
                columns.setdefault(label, {})[row] = cell.removesuffix(" ± 0.00").removesuffix(" ± 0")
    order = {row: i for i, row in enumerate(rows)}
    return sorted(rows, key=lambda r: (TASKS.index(r.split(" / ")[0]), order[r])), columns


def rewrite(page: str, board: str) -> str:
    """`page` with every sink-task table written again from `board`."""
    rows, columns = board_columns(board)
    start, end = page.index(SECTIONS[0]), page.index(SECTIONS[1])
    lines, out, i = page[start:end].split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        labels = _cells(line)[1:] if line.startswith("| variant |") else []
        if labels and all(label in columns for label in labels):
            out += [line, lines[i + 1]]
            cells = {row: [columns[label].get(row, "-") for label in labels] for row in rows}
            out += [f"| {row} | " + " | ".join(cells[row]) + " |" for row in rows
                    if any(c != "-" for c in cells[row])]  # a row with nothing to show is left out
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            continue
        out.append(line)
        i += 1
    return page[:start] + "\n".join(out) + page[end:]


if __name__ == "__main__":
    PAGE.write_text(rewrite(PAGE.read_text(), BOARD.read_text()))
    print(f"written: {PAGE}")
