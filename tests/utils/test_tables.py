"""The one Markdown / HTML / CSV table writer."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from vitsinks.utils.stats import nan_mean_std
from vitsinks.utils.tables import html_table, markdown_table, write_csv


def test_markdown_table() -> None:
    assert markdown_table(["a", "b"], [[1, "x"], ["-", 2.5]]) == ["| a | b |", "|---|---|", "| 1 | x |", "| - | 2.5 |"]


def test_html_table_escapes_and_classes() -> None:
    out = html_table(["a<b"], [["x&y", ("1", "best")]], "t", sep="\n")
    assert out == ('<table id="t"><thead><tr><th>a&lt;b</th></tr></thead>\n<tbody><tr><td>x&amp;y</td>'
                   '<td class="best">1</td></tr></tbody></table>')


def test_write_csv_rows_by_position_and_by_key(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv", ["a", "b"], [[1, 2], {"b": 4, "a": 3}, {"a": 5}])
    assert list(csv.reader((tmp_path / "t.csv").open())) == [["a", "b"], ["1", "2"], ["3", "4"], ["5", ""]]
    with pytest.raises(ValueError):
        write_csv(tmp_path / "bad.csv", ["a"], [{"a": 1, "c": 2}])
    assert not (tmp_path / "bad.csv").exists()  # atomic: a failed write leaves nothing


def test_nan_mean_std_by_hand() -> None:
    mean, std, n = nan_mean_std([1.0, float("nan"), 3.0, None])
    assert (mean, n) == (2.0, 2) and std == pytest.approx(2 ** 0.5)
    single = nan_mean_std([5.0])
    assert single[0] == 5.0 and single[1] != single[1] and single[2] == 1  # one value: NaN std
    empty = nan_mean_std([])
    assert empty[0] != empty[0] and empty[2] == 0


def test_a_pipe_in_a_cell_is_escaped_so_the_row_keeps_its_columns() -> None:
    lines = markdown_table(["max |x|", "b"], [["a|b", 1]])
    assert lines[0] == "| max \\|x\\| | b |" and lines[2] == "| a\\|b | 1 |"
    unescaped = [line.replace("\\|", "") for line in lines]
    assert {line.count("|") for line in unescaped} == {3}  # every line splits into the header's two cells
