"""A run's directory: the one place that knows its layout. One writer at a time.

    <runs_dir>/<name>/config.yaml                  the resolved config of the latest launch
                      status.json                  running | finished | interrupted | failed | stopped, the step
                      metrics.jsonl                (vitsinks.train.tracking)
                      checkpoints/                 last.pt and step_XXXXXXX.pt (written atomically, never with NaN)
                      diagnostics/<checkpoint>/    summary.json, per_image.npz, sink_table.*, plots
                      diagnostics/over_training.*  sinks vs step
                      interventions/<checkpoint>/  the causal-intervention report
                      results/<kind>.json          evaluation results (linear probe, dense probes, ...)
                      quant/<format>/              the quantized copy of the run's model, a derived run (quantize)
                      eval_cache/                  cached evaluation features
                      wandb/                       wandb's own files (`wandb.init(dir=<run>)` names this folder)
                      .lock                        held while a process trains the run

A checkpoint `<run>/checkpoints/<stem>.pt` has its analyses under `diagnostics/<stem>` and `interventions/<stem>`;
the diagnosis after training is `final`. A loose checkpoint file has its analyses laid out as a run's under
`<runs_dir>/diagnostics|interventions|quant/<model>` (`model_folder`), each folder recording which file it holds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vitsinks.utils import files
from vitsinks.utils.errors import BadValue
from vitsinks.utils.generations import Kind

STEP_RE = re.compile(r"^step_(\d+)\.pt$")
FINAL = "final"  # the diagnosis of the final checkpoint, written after training
SUMMARY = "summary.json"  # the summary of one diagnosis or of one interventions report
SOURCE = "source.json"  # in an import or a loose checkpoint file's folder: which model its results are of
CONFIG = "config.yaml"  # a run's resolved config; also beside an interventions report, the settings it was made with
PER_IMAGE = "per_image.npz"  # in a diagnosis's folder: its per-image fields
LOCK = ".lock"  # held while a process writes a run (or a diagnosis its folder)
LEADERBOARD = "leaderboard"  # the default folder of a leaderboard of a runs folder, sweep or run
LEADERBOARD_INPUTS = "inputs"  # in a leaderboard's folder, beside the tables: the files it read
# A leaderboard's folder holds one generation of its tables and inputs (`utils.generations`)
LEADERBOARD_FILES = Kind("leaderboard", marks=("leaderboard.md", f"{LEADERBOARD_INPUTS}/leaderboard.json"), legacy=(
    "leaderboard.md", "leaderboard.csv", "leaderboard.html", "leaderboard.png", "runs.csv", LEADERBOARD_INPUTS))
STEP_DIR_RE = re.compile(r"^step_(\d+)$")  # a periodic checkpoint's diagnosis folder


class RunDir:
    """The files of one run. Only the main rank writes; `lock()` refuses a second process on the same run."""

    def __init__(self, path: Path | str, is_main: bool = True) -> None:
        self.path, self.is_main = Path(path), is_main
        self._lock: files.FileLock | None = None

    @classmethod
    def of_checkpoint(cls, ckpt: Path | str) -> RunDir:
        """The run a checkpoint `<run>/checkpoints/<stem>.pt` belongs to."""
        return cls(Path(ckpt).parent.parent)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        """`config.yaml`: the resolved config of the latest launch (a folder with one is a run, `is_run`)."""
        return self.path / CONFIG

    @property
    def status(self) -> Path:
        return self.path / "status.json"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def ckpt_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def last(self) -> Path:
        return self.checkpoint("last")

    def checkpoint(self, stem: str) -> Path:
        """`checkpoints/<stem>.pt` (`last`, `step_0000100`): the checkpoint whose analyses are named `stem`."""
        return self.ckpt_dir / f"{stem}.pt"

    def step_checkpoint(self, step: int) -> Path:
        return self.checkpoint(f"step_{step:07d}")

    def step_checkpoints(self) -> dict[int, Path]:
        """The periodic checkpoints on disk by step."""
        return {int(m.group(1)): p for p in self.ckpt_dir.glob("step_*.pt") if (m := STEP_RE.match(p.name))}

    def resume_candidates(self) -> list[Path]:
        """`last.pt`, then the periodic `step_*.pt` newest first: the order resuming tries them in."""
        steps = [p for _, p in sorted(self.step_checkpoints().items(), reverse=True)]
        return ([self.last] if self.last.is_file() else []) + steps

    @property
    def diagnostics_root(self) -> Path:
        return self.path / "diagnostics"

    def diagnostics(self, stem: str) -> Path:
        """The diagnostics folder of checkpoint `stem` (`step_0000100`, `last`, or `final` after training)."""
        return self.diagnostics_root / stem

    def step_diagnostics(self, step: int) -> Path:
        return self.diagnostics(f"step_{step:07d}")

    def diagnosed_steps(self) -> dict[int, Path]:
        """`summary.json` of every step's diagnosis on disk, by step."""
        return {int(p.parent.name[5:]): p for p in self.diagnostics_root.glob(f"step_*/{SUMMARY}")}

    def step_diagnostics_dirs(self) -> dict[int, Path]:
        """Every step's diagnosis folder on disk (`diagnostics/step_XXXXXXX/`, finished or not), by step."""
        return {int(m.group(1)): p for p in self.diagnostics_root.glob("step_*")
                if p.is_dir() and (m := STEP_DIR_RE.match(p.name))}

    def summary(self, stem: str) -> Path:
        """The diagnostics summary of checkpoint `stem`."""
        return self.diagnostics(stem) / SUMMARY

    def per_image(self, stem: str) -> Path:
        """The per-image diagnostics fields of checkpoint `stem`."""
        return self.diagnostics(stem) / PER_IMAGE

    def latest_summary(self) -> Path | None:
        """The summary of the final checkpoint's newest diagnosis (`final`, `last`), else the newest step's, or None."""
        if found := [p for p in (self.summary(FINAL), self.summary(self.last.stem)) if p.is_file()]:
            return max(found, key=lambda p: p.stat().st_mtime_ns)
        steps = self.diagnosed_steps()
        return steps[max(steps)] if steps else None

    def rediagnose(self, stem: str) -> str:
        """The fix for a torn file of checkpoint `stem`'s diagnosis: the command that writes it again."""
        ckpt = self.last if stem == FINAL else self.checkpoint(stem)
        if not ckpt.is_file():
            return f"delete {self.diagnostics(stem)}: its checkpoint was not kept, so it cannot be diagnosed again"
        return f"rerun `python -m vitsinks.diagnose ckpt={ckpt}`"

    def over_training(self, suffix: str) -> Path:
        """`diagnostics/over_training.<suffix>` (png, json, csv): sinks vs step."""
        return self.diagnostics_root / f"over_training.{suffix}"

    @property
    def interventions_root(self) -> Path:
        return self.path / "interventions"

    def interventions(self, stem: str) -> Path:
        """The interventions report of checkpoint `stem` (`interventions/<stem>/`)."""
        return self.interventions_root / stem

    def latest_interventions(self) -> Path | None:
        """The interventions summary of `last.pt`, else the newest one written, else None."""
        last = self.interventions(self.last.stem) / SUMMARY
        if last.is_file():
            return last
        found = sorted(self.interventions_root.glob(f"*/{SUMMARY}"), key=lambda p: p.stat().st_mtime)
        return found[-1] if found else None

    @property
    def results(self) -> Path:
        return self.path / "results"

    def result(self, kind: str) -> Path:
        """`results/<kind>.json` (`linear`, `dense_ade20k`, ...)."""
        return self.results / f"{kind}.json"

    def results_of(self, prefix: str) -> list[Path]:
        """Every `results/<prefix>*.json` on disk, by name (`dense_`: the dense probes of every data and protocol)."""
        return sorted(self.results.glob(f"{prefix}*.json"))

    @property
    def eval_cache(self) -> Path:
        """Cached evaluation features (`vitsinks.probes.features`)."""
        return self.path / "eval_cache"

    def quantized(self, fmt: str) -> Path:
        """`quant/<fmt>/`: the derived run holding the run's model quantized in format `fmt` (`w8a8`)."""
        return self.path / "quant" / fmt

    def quantized_runs(self) -> list[RunDir]:
        """Every quantized copy of the run that has its config (`quantized`), by format name."""
        return [RunDir(p.parent) for p in sorted(self.quantized("*").parent.glob(f"*/{CONFIG}"))]

    @property
    def lock_file(self) -> Path:
        """`.lock`: held while a process writes the run (`lock`); `launch status` reads its holder from it."""
        return self.path / LOCK

    def is_run(self) -> bool:
        return self.config.is_file()

    def lock(self, fix: str = "wait for it to finish, or give this run another name (name=...)") -> None:
        """Take the run's lock (until `unlock` or the process ends); another live writer, or a file system without
        `flock`, is a `BadValue` ending in `fix`."""
        if not self.is_main or self._lock is not None:
            return
        self._lock = files.FileLock(self.lock_file, f"run directory {self.path}", fix).acquire()

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @contextmanager
    def locked(self, fix: str) -> Iterator[RunDir]:
        """The run's lock around a block (`lock(fix)`; one held already is kept past it); the folders the lock made
        are removed when they hold nothing else afterwards."""
        held = self._lock is not None
        made = [p for p in (self.path, *self.path.parents) if not p.exists()]  # the folders the lock will make
        self.lock(fix)
        try:
            yield self
        finally:
            if not held:
                try:
                    if made and self.is_main and self.path.is_dir() and \
                            [p.name for p in self.path.iterdir()] == [LOCK]:
                        self.lock_file.unlink()  # while held: a waiter sees the file gone and takes a new one
                        for folder in made:
                            if folder.is_dir() and not any(folder.iterdir()):
                                folder.rmdir()
                finally:
                    self.unlock()

    def start(self, cfg: DictConfig | dict[str, Any]) -> None:
        """Before training: remove the temp files of killed writes, write the resolved config."""
        if not self.is_main:
            return
        for leftover in files.remove_leftovers(self.ckpt_dir) + files.remove_leftovers(self.path):
            print(f"removed {leftover} (left by a write that was killed)", flush=True)
        files.write_text(self.config, OmegaConf.to_yaml(cfg, resolve=True))

    def write_status(self, status: str, quiet: bool = False, **info: Any) -> None:
        """`status.json`, atomically; with `quiet` (on the way out of a failure) a refused write is only a warning."""
        if not (self.is_main and self.path.is_dir()):
            return
        try:
            files.write_json(self.status, {"status": status, **info})
        except files.DiskFault as err:
            if not quiet:
                raise
            print(f"warning: {self.status} still says what it said before: {err}", file=sys.stderr, flush=True)

    def status_info(self) -> dict[str, Any]:
        """What `status.json` says beside the status itself (and an error), or {} without a readable one."""
        try:
            said = json.loads(self.status.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in said.items() if k not in ("status", "error")} if isinstance(said, dict) else {}

    @contextmanager
    def working(self, **info: Any) -> Iterator[None]:
        """`status.json` around work on a run that is not training: `running` during the block, then `finished`,
        `failed` (with the message) or `stopped` (SIGINT or SIGTERM); `info` joins what it said already. A SIGTERM
        that would kill the process unwinds the block first, then ends the process by the same signal."""
        info = {**self.status_info(), **info}
        self.write_status("running", **info)
        catch = threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        if catch:
            signal.signal(signal.SIGTERM, _raise_stopped)
        try:
            yield
        except (KeyboardInterrupt, Stopped) as stop:
            name = "SIGTERM" if isinstance(stop, Stopped) else "SIGINT"
            self.write_status("stopped", quiet=True, error=f"stopped by {name} before its results were written",
                              **info)
            if isinstance(stop, Stopped):
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)  # end as the signal would have
            raise
        except BaseException as err:
            self.write_status("failed", quiet=True, error=" ".join(str(err).split()) or type(err).__name__, **info)
            raise
        finally:
            if catch:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.write_status("finished", **info)

    def latest(self) -> str:
        """The newest checkpoint on disk, for messages: its path, or that there is none yet."""
        found = self.resume_candidates()
        return f"{found[0]} is the last good checkpoint" if found else \
            f"no checkpoint was written yet (a relaunch starts {self.path.name} from step 0)"


class Stopped(BaseException):
    """SIGTERM during `RunDir.working` (a `BaseException`, so that no `except Exception` swallows it)."""


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signal.Signals(signum).name)


def find_runs(src: Path | str) -> list[RunDir]:
    """The runs under `src` (a runs folder or a sweep folder, one level deep), or `src` itself when it is a run."""
    src = Path(src)
    found = sorted(p.parent for p in src.glob(f"*/{CONFIG}"))
    if not found and RunDir(src).is_run():
        found = [src]
    return [RunDir(p) for p in found]


def leaderboard_dir(src: Path | str) -> Path:
    """Where the leaderboard of `runs=src` goes by default: `<src>/leaderboard`, or beside a sweep's manifest."""
    src = Path(src)
    return src.parent / LEADERBOARD if src.suffix == ".json" else src / LEADERBOARD


def model_name(source: str | None, name: str) -> str:
    """What a model that is not a run is called in the runs folder: a file by its stem, a hub name with '/' as '_'."""
    if source and Path(source).expanduser().is_file():
        return Path(source).stem
    return str(source or name).replace("/", "_")


def _source_id(source: str | None, name: str) -> str:
    path = Path(source).expanduser() if source else None
    return str(path.resolve()) if path is not None and path.is_file() else str(source or name)


def _held(folder: Path) -> str | None:
    record, fix = folder / SOURCE, f"delete {folder} and rerun the command that wrote it"
    return files.read_json(record, fix).get("source") if record.is_file() else None


def holds(folder: Path, source: str | None, name: str = "") -> bool:
    """`folder` records (`source.json`) that its results are those of `source`."""
    return _held(folder) == _source_id(source, name)


def model_folder(base: Path | str, source: str | None, name: str, folder_name: str | None = None) -> Path:
    """`<base>/<model_name>` (or `<base>/<folder_name>`), recorded (`source.json`) as holding the results of `source`;
    a `BadValue` when it holds another model's results (a folder of a failed attempt is taken over)."""
    folder = model_folder_path(base, source, name, folder_name)
    folder.mkdir(parents=True, exist_ok=True)
    files.write_json(folder / SOURCE, {"source": _source_id(source, name)})
    return folder


def model_folder_path(base: Path | str, source: str | None, name: str, folder_name: str | None = None) -> Path:
    """Where `model_folder` would put the results of `source`, refused as it refuses them; looks only."""
    folder = Path(base) / (folder_name or model_name(source, name))
    held, held_by = _held(folder), _source_id(source, name)
    if held not in (None, held_by) and any(_holds_results(p) for p in folder.iterdir()):
        raise BadValue(f"{folder} holds the results of {held}, not of {held_by}: give this one another runs_dir=")
    return folder


def _holds_results(p: Path) -> bool:
    """Whether `p`, in a model's folder, is a result: not the record, a lock, a temp file or an empty folder."""
    if p.name in (SOURCE, LOCK) or p.name.endswith(files.TMP_SUFFIX):
        return False
    return not p.is_dir() or any(_holds_results(c) for c in p.iterdir())


def in_run(ckpt: Path | str) -> bool:
    """`ckpt` is a run's checkpoint (`<run>/checkpoints/<stem>.pt`), not a loose file."""
    return Path(ckpt).parent.name == "checkpoints"


def analyses_dir(ckpt: Path | str, kind: str, runs_dir: Path | str, claim: bool = True) -> Path:
    """Where the `kind` analyses (`diagnostics`, `interventions`, `quant`) of checkpoint `ckpt` go: its run's
    `<kind>/<stem>` (for `quant` the run's folder), or for a loose file `<runs_dir>/<kind>/<file name>`
    (`model_folder`; without `claim`, `model_folder_path`: looks only)."""
    ckpt = Path(ckpt)
    if in_run(ckpt):
        run = RunDir.of_checkpoint(ckpt)
        return run.path if kind == "quant" else run.path / kind / ckpt.stem
    return (model_folder if claim else model_folder_path)(Path(runs_dir) / kind, str(ckpt), ckpt.stem)


def quant_result(ckpt: Path | str, runs_dir: Path | str) -> dict[str, Any] | None:
    """The W8A8 result of checkpoint `ckpt` where `quantize` writes it, or None (one that names another checkpoint,
    or in a folder recording another file, too). Looks only."""
    ckpt = Path(ckpt)
    folder = RunDir.of_checkpoint(ckpt).path if in_run(ckpt) else Path(runs_dir) / "quant" / model_name(str(ckpt), "")
    path = RunDir(folder).result("quant")
    if not path.is_file() or not (in_run(ckpt) or holds(folder, str(ckpt))):
        return None
    quant = files.read_json(path, f"rerun `python -m vitsinks.quantize ckpt={ckpt}`")
    return quant if Path(str(quant.get("checkpoint"))).name == ckpt.name else None
