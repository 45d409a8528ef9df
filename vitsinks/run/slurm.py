"""SLURM through submitit: the executor from `cluster.*`, the checks before submitting, and the job callable."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import submitit
from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.schema import to_container
from vitsinks.run.pipeline import train_and_evaluate
from vitsinks.train.trainer import Trainer
from vitsinks.utils.distributed import cleanup
from vitsinks.utils.errors import BadValue
from vitsinks.utils.registry import import_plugins

MIN_WORK_S = 60  # a job must be able to train at least this long before its time-limit signal


class SubmissionError(BadValue):
    """The job cannot be submitted as configured; nothing was submitted."""


def check_submittable(cfg: DictConfig) -> None:
    """Fail before submitting anything: unknown partition, a time limit too short to save, an unwritable run dir."""
    c = cfg.cluster
    if shutil.which("sbatch") is None:
        raise SubmissionError("cluster=slurm but `sbatch` is not on PATH: run on a SLURM login node, or use "
                              "cluster=local (bash slurm/local-cluster.sh start runs a local SLURM)")
    if c.partition:
        out = subprocess.run(["sinfo", "-h", "-p", c.partition, "-o", "%P"], capture_output=True, text=True)
        if out.returncode != 0 or not out.stdout.strip():
            known = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True).stdout.split()
            raise SubmissionError(f"SLURM partition {c.partition!r} does not exist (available: "
                                  f"{', '.join(p.rstrip('*') for p in known) or 'none'}): set cluster.partition")
    if c.time_min * 60 < c.signal_delay_s + MIN_WORK_S:
        raise SubmissionError(
            f"cluster.time_min={c.time_min} leaves no time to train and save a checkpoint before the signal "
            f"{c.signal_delay_s} s ahead of the limit: raise cluster.time_min to at least "
            f"{-(-(c.signal_delay_s + MIN_WORK_S) // 60)} or lower cluster.signal_delay_s")
    if c.signal_delay_s < 10:
        raise SubmissionError(f"cluster.signal_delay_s={c.signal_delay_s} is too short to save a checkpoint: "
                              f"give at least 10 s (120 s is safe for large models)")
    for folder in {Path(cfg.runs_dir).resolve(), logs_dir(cfg)}:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".write-test-{uuid.uuid4().hex}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as err:
            raise SubmissionError(f"cannot write to {folder} ({err.strerror}): the run directory must be a "
                                  f"writable folder that the compute nodes share; set runs_dir=...") from err


def logs_dir(cfg: DictConfig) -> Path:
    return Path(cfg.cluster.logs_dir or Path(cfg.runs_dir) / "slurm_logs").resolve()


def executor(cfg: DictConfig, folder: Path, name: str | None = None) -> submitit.AutoExecutor:
    """A submitit executor with the job shape of `cfg.cluster`; `name`: the job name (default `vitsinks-<exp>`)."""
    c = cfg.cluster
    ex = submitit.AutoExecutor(folder=str(folder / "%j"), cluster="slurm", slurm_max_num_timeout=c.max_requeues)
    tasks = c.gpus_per_node if c.gpus_per_node > 0 else c.tasks_per_node
    params: dict[str, Any] = {
        "name": name or f"vitsinks-{cfg.exp}", "nodes": c.nodes, "tasks_per_node": tasks,
        "cpus_per_task": c.cpus_per_task, "timeout_min": c.time_min, "slurm_signal_delay_s": c.signal_delay_s,
        "slurm_array_parallelism": c.array_parallelism, "slurm_additional_parameters": dict(c.additional),
    }
    if c.gpus_per_node > 0:
        params["gpus_per_node"] = c.gpus_per_node
    if c.mem_gb:
        params["mem_gb"] = c.mem_gb
    for key in ("partition", "account", "qos", "constraint"):
        if c[key]:
            params[f"slurm_{key}"] = c[key]
    if c.setup:
        params["slurm_setup"] = list(c.setup)
    ex.update_parameters(**params)
    return ex


class TrainJob(submitit.helpers.Checkpointable):
    """A SLURM task: train (resuming), and on preemption stop every rank after one step, save and requeue."""

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        cfg = OmegaConf.create(config)
        import_plugins(cfg.get("plugins") or [])  # what they register (a data set, an objective), in this process too
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        trainer = Trainer(cfg)
        sig = getattr(signal, os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "SIGUSR2"))  # submitit's checkpoint-and-requeue
        submitit_handler = signal.getsignal(sig)
        caught: list[int] = []

        def on_preemption(signum: int, frame: Any) -> None:
            caught.append(signum)
            trainer.request_stop()

        signal.signal(sig, on_preemption)
        try:
            summary = train_and_evaluate(trainer)
            if caught and summary["status"] == "interrupted" and callable(submitit_handler):
                submitit_handler(caught[0], None)  # checkpoint() + requeue + exit (rank 0); returns on others
            return summary
        finally:
            cleanup()


def submit(cfgs: list[DictConfig], folder: Path, job: Callable[[dict[str, Any]], Any] | None = None,
           name: str | None = None) -> list[submitit.Job]:
    """One job for one config, one job array for several; `job` is what each task runs (default `TrainJob`)."""
    ex = executor(cfgs[0], folder, name)
    configs = [to_container(c) for c in cfgs]
    fn = job or TrainJob()
    if len(configs) == 1:
        return [ex.submit(fn, configs[0])]
    return ex.map_array(fn, configs)


FAILED_STATES = ("FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")
# what a run's own status.json says, in SLURM's words, for when SLURM no longer knows the job
RUN_STATES = {"finished": "COMPLETED", "failed": "FAILED", "running": "RUNNING", "interrupted": "REQUEUED"}


def job_state(job_id: str, folder: Path, run: dict[str, Any] | None = None) -> str:
    """SLURM state of a job id via sacct; when SLURM cannot tell, the run's own status, marked `(status.json)`."""
    try:
        with warnings.catch_warnings():  # submitit warns on every failed sacct call
            warnings.simplefilter("ignore")
            logging.getLogger("submitit").setLevel(logging.ERROR)
            state = submitit.SlurmJob(folder=str(folder / "%j"), job_id=job_id).state
    except Exception:  # noqa: BLE001 - no sacct / job purged: report what we can
        state = "UNKNOWN"
    if state.startswith("UNKNOWN") and run is not None and run.get("status") in RUN_STATES:
        return f"{RUN_STATES[run['status']]} (status.json)"
    return state


def log_tail(job_id: str, folder: Path, lines: int = 15) -> str:
    """Last lines of a job's stderr (submitit log), or '' when there is none."""
    job: submitit.SlurmJob[Any] = submitit.SlurmJob(folder=str(folder / "%j"), job_id=job_id)
    for path in (job.paths.stderr, job.paths.stdout):
        if path.exists():
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""
