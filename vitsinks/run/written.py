"""What vitsinks wrote in a run folder, removed when a derived run is replaced (`trainfree.overwrite=true`, and
`quantize` again): the config (last), status and metrics, each diagnosis, interventions report and leaderboard, the
page over training, and in vitsinks' own folders the kinds of file it writes there (with temp files of killed
writes). Folders left empty go too; the user's files stay.
"""

from __future__ import annotations

from pathlib import Path

from vitsinks.diagnostics import DIAGNOSIS
from vitsinks.diagnostics.page import REPORT, REPORT_JSON, TRAINING_PNG
from vitsinks.interventions.report import INTERVENTIONS, SHARDS
from vitsinks.utils import files
from vitsinks.utils.generations import clear
from vitsinks.utils.rundir import CONFIG, LEADERBOARD_FILES, RunDir
from vitsinks.utils.rundir import LEADERBOARD as LEADERBOARD_DIR

SHARD_FILES = ("rows.csv", "meta.json", CONFIG)  # in each shard's folder; `array.json` beside them (SLURM's job ids)


def _remove(folder: Path, keep_folder: bool = False, **which: tuple[str, ...]) -> None:
    """Remove `folder`'s files named `names` or ending in `suffixes` (and temp files), then the empty folder."""
    if not folder.is_dir():
        return
    names, suffixes = which.get("names", ()), which.get("suffixes", ())
    for p in folder.iterdir():
        temp = p.name.startswith(".") and p.name.endswith(files.TMP_SUFFIX)
        if p.is_file() and (p.name in names or p.suffix in suffixes or temp):
            p.unlink()
    if not keep_folder and not any(folder.iterdir()):
        folder.rmdir()


def clear_run(run: RunDir) -> None:
    """Remove what vitsinks wrote in `run` (module docstring), and nothing else."""
    if not run.path.is_dir():
        return
    for folder in sorted(p for p in run.diagnostics_root.glob("*") if p.is_dir()):
        clear(folder, DIAGNOSIS)
    _remove(run.diagnostics_root, names=(REPORT, REPORT_JSON, TRAINING_PNG,
                                         *(run.over_training(s).name for s in ("png", "json", "csv"))))
    for folder in sorted(p for p in run.interventions_root.glob("*") if p.is_dir()):
        for shard in sorted(p for p in (folder / SHARDS).glob("*") if p.is_dir()):
            _remove(shard, names=SHARD_FILES)
        _remove(folder / SHARDS, names=("array.json",))
        clear(folder, INTERVENTIONS)
    _remove(run.interventions_root)
    clear(run.path / LEADERBOARD_DIR, LEADERBOARD_FILES)
    for folder, suffixes in ((run.ckpt_dir, (".pt",)), (run.results, (".json", ".pt", ".png")),
                             (run.eval_cache, (".pt",))):  # the kinds of file vitsinks writes in its folders
        _remove(folder, suffixes=suffixes)
    _remove(run.path, keep_folder=True, names=(run.status.name, run.metrics.name))
    run.config.unlink(missing_ok=True)
