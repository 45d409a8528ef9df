"""A derived run replaced (`trainfree.overwrite=true`, `quantize` again) loses what vitsinks wrote in it and nothing
else: its config, status, checkpoints, results, feature caches, diagnoses (recorded, or an earlier version's names),
interventions reports with their shards, leaderboard and run page go; the user's files beside and inside them stay."""

from __future__ import annotations

from pathlib import Path

from vitsinks.diagnostics import DIAGNOSIS
from vitsinks.interventions.report import INTERVENTIONS
from vitsinks.report.leaderboard_inputs import LEADERBOARD
from vitsinks.run.written import clear_run
from vitsinks.utils.generations import generation
from vitsinks.utils.rundir import RunDir


def write(folder: Path, *names: str) -> None:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(name)


def test_clear_run_removes_what_vitsinks_wrote_and_nothing_else(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "src+mean_massive")
    write(run.path, "config.yaml", "status.json", "metrics.jsonl", ".lock", ".status.json.ab12.tmp",
          "checkpoints/last.pt", "checkpoints/step_0000003.pt", "checkpoints/.last.pt.cd34.tmp",
          "results/linear.json", "results/dense_synthetic.json", "results/dense_synthetic_head.pt",
          "results/dense_synthetic.png", "eval_cache/lin-0123.pt",
          "diagnostics/report.html", "diagnostics/report.json", "diagnostics/training_curves.png",
          "diagnostics/over_training.png", "diagnostics/over_training.json", "diagnostics/over_training.csv",
          "diagnostics/step_0000003/per_image.npz", "diagnostics/step_0000003/summary.json",  # an earlier version's
          "diagnostics/step_0000003/sink_heatmap.png", "interventions/.last.lock",
          "interventions/last/shards/0-of-2/rows.csv", "interventions/last/shards/0-of-2/meta.json",
          "interventions/last/shards/0-of-2/config.yaml", "interventions/last/shards/array.json")
    for folder, kind, names in ((run.diagnostics("final"), DIAGNOSIS, ("summary.json", "per_image.npz")),
                                (run.interventions("last"), INTERVENTIONS, ("summary.json", "interventions.csv")),
                                (run.path / "leaderboard", LEADERBOARD, ("leaderboard.md", "inputs/r/config.yaml"))):
        with generation(folder, kind) as stage:
            write(stage, *names)
    users = ("my_notes.txt", "photos/cat.jpg", "checkpoints/README.txt", "results/notes.md",
             "diagnostics/final/mine.txt", "diagnostics/step_0000003/mine.txt", "interventions/last/mine.txt",
             "leaderboard/inputs/r/mine.txt", "eval_cache/mine.txt")
    write(run.path, *users)
    clear_run(run)
    left = sorted(p.relative_to(run.path).as_posix() for p in run.path.rglob("*") if p.is_file())
    assert left == sorted([*users, ".lock", "interventions/.last.lock", "diagnostics/final/.vitsinks.json",
                           "diagnostics/step_0000003/.vitsinks.json", "interventions/last/.vitsinks.json",
                           "leaderboard/.vitsinks.json"])
    assert not (run.path / "interventions" / "last" / "shards").exists()  # emptied, then removed
    clear_run(RunDir(tmp_path / "never"))  # no such run: nothing to do
