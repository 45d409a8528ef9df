"""eval/residual/findings.py, the per-run numbers docs/studies.md quotes: on a board whose answers are planted (and
computed here by hand), and the committed page against what the script writes from the committed inputs."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "eval" / "residual" / "findings.py"
spec = importlib.util.spec_from_file_location("findings", SCRIPT)
findings = importlib.util.module_from_spec(spec)
spec.loader.exec_module(findings)

COLUMNS = ["run", "variant", "seed", "online_top1", "linear_top1", "dense_toy", "w8a8_cos_err", "w8a8_d_linear",
           "w8a8_d_online", "w8a8_d_dense"]


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
            ("toy-base-s0+zero_massive", "base + zeroed", 0, "nan", 62.5, 14.75, "nan", "nan", "nan", "nan")]
    with (board / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(runs)
    (board / "leaderboard.csv").write_text("variant,seeds\nbase,2\nbase + zeroed,1\n")
    plants = {"toy-base-s0": summary([0.0, 0.0, 0.5], [2.5, 2.0, 1.5], [12.0, 9.0, 8.0]),
              "toy-base-s1": summary([0.25, 0.0, 0.0], [2.0, 1.8, 1.25], [11.0, 9.0, 7.0]),
              "toy-base-s0+zero_massive": summary([0.0, 0.0, 0.0], [2.0, 1.5, 1.5], [5.0, 5.0, 5.0])}
    for run, s in plants.items():
        (board / "inputs" / run / "diagnostics" / "last").mkdir(parents=True)
        (board / "inputs" / run / "diagnostics" / "last" / "summary.json").write_text(json.dumps(s))
        config = {"trainfree": {"method": "zero_massive", "source": "runs/toy-base-s0/checkpoints/last.pt"}} \
            if "+" in run else {"trainfree": {"method": "zero_massive", "source": None}}
        (board / "inputs" / run / "config.yaml").write_text(yaml.safe_dump(config))


def table(page: str, heading: str) -> list[list[str]]:
    """The body rows of the table under `heading`, as cells."""
    part = page.split(f"## {heading}")[1].split("\n## ")[0]
    rows = [line for line in part.splitlines() if line.startswith("|")][2:]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows]


def test_findings_of_a_planted_board(tmp_path: Path) -> None:
    write_board(tmp_path)
    page = findings.findings(tmp_path)
    residual = table(page, "Residual side")
    assert [r[0] for r in residual] == ["toy-base-s0", "toy-base-s1"]  # trained runs only, seed-major
    # s0: most > 5x at block 2 (0.5), patches > 5x at the last block 0.5; s1: at block 0 (0.25), none at the last
    assert residual[0][1:] == ["7.00", "0.25", "0.50 (2)", "0.00", "0.50", "2.50 -> 1.50", "12.0 -> 8.0"]
    assert residual[1][3:6] == ["0.25 (0)", "0.00", "0.00"]
    probes = table(page, "Probes under the training-free edits and W8A8")
    # the derived run's change against its source run (62.5 - 61.0, 14.75 - 15.0); s1 has no derived run
    assert probes[0] == ["toy-base-s0", "61.00", "15.00", "+1.50 / -0.25", "1.0e-04", "+0.50 / -0.25 / -0.10"]
    assert probes[1][3] == "-"
    assert table(page, "Seed range per variant (max - min over its seeds)") == [
        ["base", "2", "2.50", "2.00", "0.50", "2.0e-04"]]


def test_the_script_refuses_a_folder_that_is_not_a_board(tmp_path: Path, capsys) -> None:
    assert findings.main([str(tmp_path)]) == 2
    assert "a leaderboard folder with runs.csv" in capsys.readouterr().err
    assert not (tmp_path / "findings.md").exists()


def test_the_committed_findings_are_what_the_script_writes_from_the_committed_inputs() -> None:
    committed = sorted(ROOT.glob("eval/**/findings.md"))
    assert committed, "no committed findings.md: `python eval/residual/findings.py eval/residual/fashion_mnist`"
    for page in committed:
        assert page.read_text() == findings.findings(page.parent), (
            f"{page.relative_to(ROOT)} is stale: `python eval/residual/findings.py {page.parent.relative_to(ROOT)}`")
