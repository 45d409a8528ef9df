"""`python -m vitsinks.bench first-run`: README command 1 (`python -m vitsinks.launch exp=gate+reg`), timed whole in a
child process (wall, CPU with its loader workers, machine load), its CPU time split by phase (each second in one)."""

from __future__ import annotations

import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vitsinks import launch
from vitsinks.benchmarks.timing import table
from vitsinks.objectives import monitors
from vitsinks.run import pipeline
from vitsinks.train import callbacks, trainer
from vitsinks.utils.errors import UserError

COMMAND = ["exp=gate+reg"]  # README command 1's arguments


def _cpu() -> float:
    """CPU seconds of this process (all threads) and of its ended children (loader workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(fn: Callable[..., Any], phase: str, acc: dict[str, list[float]],
           stack: list[list[float]]) -> Callable[..., Any]:
    """`fn` adding its wall and CPU seconds to `acc[phase]`, less those of the timed calls it makes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        frame = [0.0, 0.0]  # wall and CPU seconds of the timed calls inside this one
        stack.append(frame)
        t0, c0 = time.perf_counter(), _cpu()
        try:
            return fn(*args, **kwargs)
        finally:
            stack.pop()
            wall, cpu = time.perf_counter() - t0, _cpu() - c0
            acc.setdefault(phase, [0.0, 0.0])
            acc[phase][0] += wall - frame[0]
            acc[phase][1] += cpu - frame[1]
            if stack:
                stack[-1][0] += wall
                stack[-1][1] += cpu
    return wrapper


def _instrument(acc: dict[str, list[float]]) -> None:
    """Wrap the phases' functions where the pipeline looks them up."""
    targets: list[tuple[Any, str, str]] = [
        (trainer.Trainer, "train_step", "training steps (forward, backward, optimizer)"),
        (callbacks.Validation, "on_epoch_end", "online-probe validation"),
        (callbacks.Validation, "on_fit_end", "online-probe validation"),
        (monitors.Monitors, "__call__", "SSL monitors (k-NN bank, k-NN, RankMe)"),
        (callbacks.Diagnostics, "on_save", "diagnoses of the checkpoints"),
        (trainer.ckpt, "save", "checkpoint writes"),
        (pipeline, "linear_probe", "linear probe"),
        (pipeline, "dense_probe", "dense probe"),
        (pipeline, "diagnose_checkpoint", "final diagnosis"),
        (pipeline, "run_page", "run page and over-training plot"),
    ]
    stack: list[list[float]] = []
    for owner, name, phase in targets:
        setattr(owner, name, _timed(getattr(owner, name), phase, acc, stack))
    fit = trainer.Trainer._fit

    def fit_with_wait(self: trainer.Trainer) -> dict[str, Any]:
        try:
            return fit(self)
        finally:  # the loader wait the trainer's own clock measured (wall; the workers' CPU is theirs)
            acc["waiting for data (main process idle)"] = [self.clock.wait_s, 0.0]
    trainer.Trainer._fit = fit_with_wait  # type: ignore[method-assign]  # instrumented on purpose


def child(out: str, argv: Sequence[str]) -> None:
    """Run `launch` with `argv` under the phase timers; write the phases to `out` (JSON)."""
    acc: dict[str, list[float]] = {}
    _instrument(acc)
    try:
        launch.cli(list(argv))
    except SystemExit as err:
        if err.code not in (0, None):
            raise
    finally:
        Path(out).write_text(json.dumps(acc))


def measure(extra: Sequence[str] = ()) -> dict[str, Any]:
    """Run README command 1 (plus `extra` overrides) in a child process; its wall, CPU, load and phases."""
    with tempfile.TemporaryDirectory(prefix="vitsinks-first-run-") as tmp:
        phases = Path(tmp) / "phases.json"
        argv = [*COMMAND, f"runs_dir={tmp}/runs", *extra]
        load0, t0, c0 = os.getloadavg()[0], time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        code = "import sys; from vitsinks.benchmarks.first_run import child; child(sys.argv[1], sys.argv[2:])"
        done = subprocess.run([sys.executable, "-c", code, str(phases), *argv], capture_output=True, text=True)
        wall, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"the first run failed (exit {done.returncode}): {last}; run "
                            f"python -m vitsinks.launch {' '.join(argv)} to see it whole")
        split = json.loads(phases.read_text())
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    return {"command": "python -m vitsinks.launch " + " ".join([*COMMAND, *extra]), "wall_s": wall, "cpu_s": cpu,
            "cpus": len(os.sched_getaffinity(0)), "load_before": load0, "load_after": os.getloadavg()[0],
            "phases": split,  # the run's own lines, its temporary folder written as runs/ (the README's runs_dir)
            "closing_lines": [ln.replace(f"{tmp}/runs", "runs") for ln in done.stdout.strip().splitlines()[-3:]]}


def report(m: dict[str, Any]) -> str:
    """The measurement as text: totals, then a table of phases by CPU time."""
    phases = dict(m["phases"])
    covered_wall = sum(w for k, (w, _) in phases.items() if not k.startswith("waiting"))
    phases["other (imports, building model and data, logging)"] = [max(0.0, m["wall_s"] - covered_wall - phases.get(
        "waiting for data (main process idle)", [0.0])[0]), max(0.0, m["cpu_s"] - sum(c for _, c in phases.values()))]
    rows = [[k, f"{w:.1f}", f"{c:.1f}", f"{100 * c / m['cpu_s']:.0f}%"]
            for k, (w, c) in sorted(phases.items(), key=lambda kv: -kv[1][1])]
    head = (f"{m['command']}: wall {m['wall_s'] / 60:.1f} min, CPU {m['cpu_s'] / 60:.1f} min "
            f"(this process and its workers), {m['cpus']} CPUs, 1-min load {m['load_before']:.1f} before, "
            f"{m['load_after']:.1f} after\n\n")
    note = ("\n\nThe loader workers' CPU falls in 'other'; 'waiting for data' is wall time the training loop spent "
            "waiting for a batch.\n" + "\n".join(m["closing_lines"]))
    return head + table(rows, ["phase", "wall s", "CPU s", "share of CPU"]) + note


def run() -> str:
    """Measure and return the report."""
    return report(measure())

