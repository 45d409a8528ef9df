"""The committed leaderboards are what today's code writes: each one under eval/ is written again from the inputs
committed beside it (`<leaderboard>/inputs/`, what `bash eval/regenerate.sh` reads) and its tables compared as text
with the committed ones. The figure (PNG) is not compared: its bytes follow the matplotlib version. The other
committed results (intervention reports, report pages, the pathway task, the over-training figures) are made from
checkpoints or by training, not from summaries alone, and are not regenerated here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.helpers.scripts import load_script
from vitsinks.diagnostics.summary import DiagnosticsSummary
from vitsinks.leaderboard import leaderboard_command
from vitsinks.report.leaderboard_inputs import INPUTS, RECORD

ROOT = Path(__file__).resolve().parents[1]
findings = load_script("eval/residual/findings.py", "findings")
TEXT = (".md", ".csv", ".html", ".json")  # the tables, compared as text
FINDINGS = "findings.md"  # a board's per-run page (eval/residual/findings.py), held by tests/test_findings_script.py


def boards() -> list[Path]:
    """Every committed leaderboard: the folder of each `leaderboard.md` under eval/ (inputs aside)."""
    return sorted(p.parent for p in (ROOT / "eval").rglob("leaderboard.md")
                  if INPUTS not in p.relative_to(ROOT).parts)


def stale(board: Path, out: Path) -> list[str]:
    """Write `board` again from its inputs into `out` (the command `eval/regenerate.sh` runs); the names of its
    tables that differ, that it no longer writes, or that are new."""
    assert (board / INPUTS / RECORD).is_file(), (
        f"{board.relative_to(ROOT)} has no {INPUTS}/ to write it again from: rerun its make script (the leaderboard "
        f"command keeps its inputs)")
    assert leaderboard_command([f"runs={board / INPUTS}", f"out={out}"]) == 0
    def tables(folder: Path) -> set[str]:  # the hidden record of the files a leaderboard wrote aside
        return {p.name for p in folder.iterdir() if p.suffix in TEXT and not p.name.startswith(".")}

    written, committed = tables(out), tables(board) - {FINDINGS}
    return sorted(n for n in written | committed
                  if n not in written or n not in committed or (board / n).read_text() != (out / n).read_text())


def smallest_board() -> Path:
    """The committed leaderboard with the fewest runs (among those with inputs)."""
    found = [b for b in boards() if (b / INPUTS / RECORD).is_file()]
    if not found:
        pytest.fail("no committed leaderboard has inputs")
    return min(found, key=lambda b: len(list((b / INPUTS).glob("*/config.yaml"))))


@pytest.mark.slow
@pytest.mark.parametrize("board", boards(), ids=[str(b.relative_to(ROOT)) for b in boards()])
def test_a_committed_leaderboard_is_what_todays_code_writes_from_its_inputs(board: Path, tmp_path: Path) -> None:
    assert stale(board, tmp_path / "again") == [], (
        f"{board.relative_to(ROOT)} is stale: `bash eval/regenerate.sh` writes it again, then commit it")
    if (board / FINDINGS).is_file():  # and its findings page, as eval/regenerate.sh writes it beside the tables
        assert findings.main([str(board), str(tmp_path / "again")]) == 0
        assert (tmp_path / "again" / FINDINGS).read_text() == (board / FINDINGS).read_text(), (
            f"{board.relative_to(ROOT) / FINDINGS} is stale: `bash eval/regenerate.sh` writes it again")


def _first_diagnostics_column() -> str:
    """The key of the diagnostics summary's first leaderboard column (whatever it is called today)."""
    return DiagnosticsSummary.columns()[0].key


@pytest.mark.slow
def test_a_renamed_column_label_makes_the_leaderboard_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    columns, key = DiagnosticsSummary.columns, _first_diagnostics_column()
    monkeypatch.setattr(DiagnosticsSummary, "columns", classmethod(lambda cls: [
        dataclasses.replace(c, label=f"{c.label} (renamed)") if c.key == key else c for c in columns()]))
    assert stale(smallest_board(), tmp_path / "again") == ["leaderboard.html", "leaderboard.md"]


@pytest.mark.slow
def test_a_changed_column_value_makes_the_leaderboard_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    collect, key = DiagnosticsSummary.collect, _first_diagnostics_column()
    monkeypatch.setattr(DiagnosticsSummary, "collect", classmethod(lambda cls, run: {
        **(row := collect(run)), key: row[key] + 1}))
    assert {"leaderboard.csv", "runs.csv"} <= set(stale(smallest_board(), tmp_path / "again"))


def test_the_pathway_page_quotes_the_committed_pathway_study() -> None:
    """docs/pathway.md's results table is what eval/pathway/table.py prints from eval/pathway/broadcast_pathway.json."""
    module = load_script("eval/pathway/table.py", "pathway_table")
    quoted = module.table(json.loads((ROOT / "eval" / "pathway" / "broadcast_pathway.json").read_text()))
    assert quoted in (ROOT / "docs" / "pathway.md").read_text(), "run python eval/pathway/table.py into docs/pathway.md"


def test_the_studies_page_quotes_the_committed_sink_task_leaderboard() -> None:
    """docs/studies.md's sink-task tables are what eval/sinktasks/tables.py writes from the committed leaderboard."""
    module = load_script("eval/sinktasks/tables.py", "sink_tables")
    page = (ROOT / "docs" / "studies.md").read_text()
    assert module.rewrite(page, module.BOARD.read_text()) == page, "run python eval/sinktasks/tables.py"
