"""eval/residual/findings.py, the per-run numbers docs/studies.md quotes: on a board whose answers are planted (and
computed here by hand), and the committed page against what the script writes from the committed inputs."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import yaml

from tests.helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
findings = load_script("eval/residual/findings.py", "findings")

COLUMNS = ["run", "variant", "seed", "online_top1", "linear_top1", "dense_toy", "w8a8_cos_err", "w8a8_d_linear",
           "w8a8_d_online", "w8a8_d_dense_toy"]


def summary(k5: list[float], ratio: list[float], top: list[float]) -> dict:
    zeros = [0.0] * len(k5)
    level = {"per_image_by_block": zeros, "location_by_block": {"patch": zeros}}
    return {"massive_activations": {"ratio_by_block": ratio},
            "residual": {"high_norm": {"2.0": {"per_image_by_block": [7.0, 3.0, 0.25],
                                               "location_by_block": {"patch": [7.0, 3.0, 0.25]}},
                                       "5.0": {"per_image_by_block": k5, "location_by_block": {"patch": k5}},
                                       "10.0": level},
                         "top_activations": {"ratio_by_block": top}}}


def write_board(board: Path) -> None:
    runs = [("toy-base-s0", "base", 0, 60.0, 61.0, 15.0, 1e-4, 0.5, -0.25, -0.1),
            ("toy-base-s1", "base", 1, 62.0, 63.5, 15.5, 3e-4, 0.0, 0.0, 0.0),
            ("toy-base-s2", "base", 2, "nan", 62.0, 16.0, 2e-4, 0.0, 0.0, 0.0),  # no online probe
            ("toy-base-s0+zero_massive", "base + zeroed", 0, "nan", 62.5, 14.75, "nan", "nan", "nan", "nan"),
            ("toy-base-s1+zero_massive", "base + zeroed", 1, "nan", 63.0, 15.5, "nan", "nan", "nan", "nan")]
    with (board / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(runs)
    (board / "leaderboard.csv").write_text("variant,seeds\nbase,3\nbase + zeroed,2\n")
    plants = {"toy-base-s0": summary([0.0, 0.0, 0.5], [2.5, 2.0, 1.5], [12.0, 9.0, 8.0]),
              "toy-base-s1": summary([0.25, 0.0, 0.0], [2.0, 1.8, 1.25], [11.0, 9.0, 7.0]),
              "toy-base-s2": summary([0.0, 0.0, 0.0], [2.0, 1.8, 1.25], [11.0, 9.0, 7.0]),
              "toy-base-s0+zero_massive": summary([0.0, 0.0, 0.0], [2.0, 1.5, 1.5], [5.0, 5.0, 5.0]),
              "toy-base-s1+zero_massive": summary([0.0, 0.0, 0.0], [2.0, 1.5, 1.5], [5.0, 5.0, 5.0])}
    # probe seeds, (linear, dense); None: the result records none (an older linear one), absent: no result
    # s0's edit: its linear seed unrecorded, its dense one 0 (the run's); s1's edit: linear probed with seed 0
    seeds = {"toy-base-s0": (0, None), "toy-base-s0+zero_massive": (None, 0), "toy-base-s1": (1, 1),
             "toy-base-s1+zero_massive": (0, 1)}
    for run, s in plants.items():
        (board / "inputs" / run / "diagnostics" / "last").mkdir(parents=True)
        (board / "inputs" / run / "diagnostics" / "last" / "summary.json").write_text(json.dumps(s))
        source = f"runs/{run.split('+')[0]}/checkpoints/last.pt" if "+" in run else None
        (board / "inputs" / run / "config.yaml").write_text(
            yaml.safe_dump({"trainfree": {"method": "zero_massive", "source": source}}))
        if run in seeds:
            (board / "inputs" / run / "results").mkdir()
            linear, dense = seeds[run]
            (board / "inputs" / run / "results" / "linear.json").write_text(
                json.dumps({} if linear is None else {"seed": linear}))
            if dense is not None:
                (board / "inputs" / run / "results" / "dense_toy.json").write_text(
                    json.dumps({"probes": [{"seed": dense}]}))
    (board / "inputs" / "leaderboard.json").write_text(json.dumps({"title": "toy"}))


def table(page: str, heading: str) -> list[list[str]]:
    """The body rows of the table under `heading`, as cells."""
    part = page.split(f"## {heading}")[1].split("\n## ")[0]
    rows = [line for line in part.splitlines() if line.startswith("|")][2:]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows]


def test_findings_of_a_planted_board(tmp_path: Path) -> None:
    write_board(tmp_path)
    page = findings.findings(tmp_path)
    residual = table(page, "Residual side")
    assert [r[0] for r in residual] == ["toy-base-s0", "toy-base-s1", "toy-base-s2"]  # trained runs, seed-major
    # s0: most > 5x at block 2 (0.5), patches > 5x at the last block 0.5; s1: at block 0 (0.25), none at the last
    assert residual[0][1:] == ["7.00", "0.25", "0.50 (2)", "0.00", "0.50", "2.50 -> 1.50", "12.0 -> 8.0"]
    assert residual[1][3:6] == ["0.25 (0)", "0.00", "0.00"]
    assert residual[2][3] == "0.00"  # no token > 5x anywhere: no block named
    probes = table(page, "Probes under the training-free edits and W8A8")
    # the derived run's change against its source run (62.5 - 61.0, 14.75 - 15.0)
    assert probes[0] == ["toy-base-s0", "61.00", "15.00", "+1.50 / -0.25", "1.0e-04", "+0.50 / -0.25 / -0.10"]
    # its edit's linear probe was made with seed 0, the run's with 1: not shown; the dense probes share seed 1
    assert probes[1][3] == f"{findings.MIXED} / +0.00"
    assert probes[2][3] == "-"  # no derived run
    # linear 61 / 63.5 / 62, online 60 / 62 / none (two seeds have it), mIoU 15 / 15.5 / 16, W8A8 1e-4 .. 3e-4
    assert table(page, "Seed range per variant (max - min over its seeds)") == [
        ["base", "3", "2.50", "2.00 (2)", "1.00", "2.0e-04"]]


def test_a_change_between_a_recorded_and_an_unrecorded_probe_seed_is_not_shown() -> None:
    assert findings._change(62.0, 61.0, (1, None)) == findings.UNKNOWN
    assert findings._change(62.0, 61.0, (None, None)) == "+1.00"  # both older results: as they were compared
    assert findings._change(62.0, 61.0, (1, 2)) == findings.MIXED


def test_the_script_writes_beside_the_tables_it_reads(tmp_path: Path) -> None:
    (tmp_path / "board").mkdir()
    write_board(tmp_path / "board")
    out = tmp_path / "again"
    out.mkdir()
    for name in ("runs.csv", "leaderboard.csv"):
        (out / name).write_text((tmp_path / "board" / name).read_text().replace("63.5", "64.5"))
    assert findings.main([str(tmp_path / "board"), str(out)]) == 0
    assert not (tmp_path / "board" / "findings.md").exists()
    assert table((out / "findings.md").read_text(), "Probes under the training-free edits and W8A8")[1][1] == "64.50"


def test_the_script_refuses_a_folder_that_is_not_a_board(tmp_path: Path, capsys) -> None:
    assert findings.main([]) == 2
    assert "usage: python eval/residual/findings.py BOARD [OUT]" in capsys.readouterr().err
    assert findings.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"{tmp_path} is not a leaderboard folder with inputs")
    write_board(tmp_path)
    (tmp_path / "runs.csv").write_text((tmp_path / "runs.csv").read_text().splitlines()[0] + "\n")  # no runs
    assert findings.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "tables lack its runs" in err and "python -m vitsinks.leaderboard" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "findings.md").exists()


def test_the_committed_findings_are_what_the_script_writes_from_the_committed_inputs() -> None:
    committed = sorted(ROOT.glob("eval/**/findings.md"))
    assert committed, "no committed findings.md: `python eval/residual/findings.py eval/residual/fashion_mnist`"
    for page in committed:
        assert page.read_text() == findings.findings(page.parent), (
            f"{page.relative_to(ROOT)} is stale: `python eval/residual/findings.py {page.parent.relative_to(ROOT)}`")


def test_an_edit_without_any_probe_says_so_not_that_its_seed_is_unknown(tmp_path: Path) -> None:
    """s2's edit has no probe result at all (no results/, no value in runs.csv): its cells say there is no probe, and
    a footnote says what that means; an edit whose source has none says so too."""
    write_board(tmp_path)
    with (tmp_path / "runs.csv").open("a", newline="") as f:
        csv.writer(f).writerow(["toy-base-s2+zero_massive", "base + zeroed", 2] + ["nan"] * 7)
    edit = tmp_path / "inputs" / "toy-base-s2+zero_massive"
    (edit / "diagnostics" / "last").mkdir(parents=True)
    (edit / "diagnostics" / "last" / "summary.json").write_text(json.dumps(summary([0.0] * 3, [2.0] * 3, [5.0] * 3)))
    (edit / "config.yaml").write_text(yaml.safe_dump({"trainfree": {"method": "zero_massive",
                                                                    "source": "runs/toy-base-s2/checkpoints/last.pt"}}))
    page = findings.findings(tmp_path)
    probes = table(page, "Probes under the training-free edits and W8A8")
    assert probes[2][0] == "toy-base-s2" and probes[2][3] == f"{findings.NO_PROBE} / {findings.NO_PROBE}"
    assert findings.UNKNOWN not in probes[2][3] and f'"{findings.NO_PROBE}"' in page
    assert findings._change(math.nan, 61.0, (1, None)) == findings.NO_PROBE
    assert findings._change(62.0, math.nan, (None, 1)) == findings.NO_SOURCE_PROBE


def test_a_summary_without_residual_measures_gives_dashes_not_a_key_error(tmp_path: Path) -> None:
    """A run diagnosed with diagnostics.residual=false has no `residual` in its summary: its residual cells are `-`
    (the max / median norm, which every summary has, stays) and a line under the table says why."""
    write_board(tmp_path)
    path = tmp_path / "inputs" / "toy-base-s1" / "diagnostics" / "last" / "summary.json"
    s = json.loads(path.read_text())
    del s["residual"]
    path.write_text(json.dumps(s))
    page = findings.findings(tmp_path)
    residual = table(page, "Residual side")
    assert residual[1] == ["toy-base-s1", "-", "-", "-", "-", "-", "2.00 -> 1.25", "-"]
    assert residual[0][1] == "7.00" and findings.NO_RESIDUAL in page
    (tmp_path / "whole").mkdir()
    write_board(tmp_path / "whole")
    assert findings.NO_RESIDUAL not in findings.findings(tmp_path / "whole")


def test_a_torn_summary_or_table_is_one_line_naming_the_file_and_the_fix(tmp_path: Path, capsys) -> None:
    """A summary.json in the board's inputs cut short (a kill, a full disk): `error: <file> is torn ...: <fix>`,
    exit code 1, no traceback; a torn runs.csv the same, with the command that writes it again."""
    write_board(tmp_path)
    path = tmp_path / "inputs" / "toy-base-s1" / "diagnostics" / "last" / "summary.json"
    path.write_text(path.read_text()[:40])
    assert findings.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} is torn") and len(err.splitlines()) == 1
    assert "python -m vitsinks.leaderboard" in err and "Traceback" not in err
    (tmp_path / "b").mkdir()
    write_board(tmp_path / "b")
    runs = tmp_path / "b" / "runs.csv"
    runs.write_text(runs.read_text().rsplit(",", 3)[0] + "\n")  # the last row cut short
    assert findings.main([str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {runs} is torn") and "python -m vitsinks.leaderboard runs=" in err
    assert len(err.splitlines()) == 1
