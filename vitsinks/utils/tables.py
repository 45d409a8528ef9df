"""The one way tables are written: Markdown, HTML and CSV (atomically), for the leaderboard, the sink table, the
interventions report and the over-training table."""

from __future__ import annotations

import csv
import html
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vitsinks.utils import files

# an HTML cell: its text, or (text, CSS class) for a cell written with a class attribute
HtmlCell = str | tuple[str, str]


def _md(cell: Any) -> str:
    return str(cell).replace("|", "\\|")  # a bare pipe would end the cell (a label such as `max |x|`)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A GitHub Markdown table as lines: the header, the `|---|` rule and one line per row (pipes in cells escaped)."""
    return ["| " + " | ".join(_md(h) for h in header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(_md(c) for c in r) + " |" for r in rows]


def _td(cell: HtmlCell) -> str:
    if isinstance(cell, tuple):
        text, css = cell
        return f'<td class="{css}">{html.escape(text)}</td>'
    return f"<td>{html.escape(str(cell))}</td>"


def html_table(header: Sequence[str], rows: Iterable[Sequence[HtmlCell]], table_id: str, sep: str = "") -> str:
    """An HTML table with `id`, every cell escaped; `sep` goes between its head and its body."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(_td(c) for c in r) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead>{sep}<tbody>{body}</tbody></table>'


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> None:
    """A CSV file with `header`, written atomically. Mapping rows are written by key (a missing key: an empty
    cell; a key not in `header`: an error), sequence rows as they are."""
    with files.atomic_open(path, newline="") as f:
        plain = csv.writer(f)
        by_key = csv.DictWriter(f, fieldnames=list(header), extrasaction="raise")
        plain.writerow(header)
        for r in rows:
            if isinstance(r, Mapping):
                by_key.writerow(r)
            else:
                plain.writerow(r)
