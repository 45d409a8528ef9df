"""Training: one `Trainer` for CPU, one GPU, or DDP over many, with exact resume from `last.pt`.

The Trainer runs the loop; the objective (`vitsinks.objectives`, chosen by `objective.name`) owns the model around
the backbone, the batches and the loss, and the extras (logging, validation, checkpoints, diagnostics) are
callbacks (`vitsinks.train.callbacks`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from vitsinks.configs.schema import to_container
from vitsinks.data import build_dataset, loader_workers, num_classes
from vitsinks.data.views import EpochSampler, sample_seed
from vitsinks.models import model_from_config, run_variant
from vitsinks.objectives import Runtime, build_objective
from vitsinks.train import checkpoint as ckpt
from vitsinks.train.callbacks import Callback, OnStep, default_callbacks
from vitsinks.train.optim import build_optimizer
from vitsinks.train.tracking import Tracker, read_metrics
from vitsinks.utils.distributed import DistInfo, all_reduce_sum, init_distributed
from vitsinks.utils.errors import ConfigError, NonFinite
from vitsinks.utils.rundir import RunDir


class NonFiniteLoss(NonFinite):
    """The loss (or the weights) became NaN or infinite; the last good checkpoint is kept."""


@dataclass
class Progress:
    """Where training stands: epoch, batches done in that epoch, optimizer steps done in total."""

    epoch: int = 0
    batch: int = 0
    step: int = 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """Owns the model, data, optimizer and run directory of one training run; `callbacks` run after the trainer's
    own (`default_callbacks`)."""

    def __init__(self, cfg: DictConfig, dist_info: DistInfo | None = None,
                 callbacks: Sequence[Callback] = ()) -> None:
        self.cfg = cfg
        self.dist = dist_info or init_distributed(cfg.cluster.device)
        self.device = self.dist.device
        self.rundir = RunDir(Path(cfg.runs_dir) / cfg.name, self.dist.is_main)
        self.run_dir, self.ckpt_dir = self.rundir.path, self.rundir.ckpt_dir
        if cfg.train.precision == "bf16" and self.device.type != "cuda":
            raise ConfigError("train.precision=bf16 needs CUDA (bf16 autocast runs on GPUs only): use auto or fp32")
        self.bf16 = self.device.type == "cuda" and cfg.train.precision in ("auto", "bf16")
        seed_everything(cfg.seed + self.dist.rank)

        self.objective = build_objective(cfg, Runtime(self.device, self.bf16, self.dist.world))
        base = build_dataset(cfg.data, "train", cfg.seed)
        self.val_set = build_dataset(cfg.data, "val", cfg.seed)
        self.num_classes = num_classes(base)
        self.train_set = self.objective.train_samples(base)
        self.sampler = EpochSampler(len(base), cfg.train.batch_size, cfg.seed, self.dist.rank, self.dist.world)
        self.total_steps = self.sampler.batches_per_epoch * cfg.train.epochs
        if cfg.train.max_steps:
            self.total_steps = min(self.total_steps, cfg.train.max_steps)

        self.model = self.objective.setup_model(model_from_config(cfg.model), self.num_classes)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg, self.sampler.batches_per_epoch,
                                                         self.total_steps, self.objective.probe_prefixes)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)  # bf16 needs no loss scaling
        self.net: torch.nn.Module = self.model
        if self.dist.world > 1:
            self.net = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if cfg.train.compile:
            self.net = torch.compile(self.net)
        self.callbacks: list[Callback] = [*default_callbacks(), *callbacks]
        self.progress = Progress()
        self.stop_requested = False  # the decision, identical on all ranks
        self._stop_signal = False  # this rank's request
        self._saved_step = -1
        self.tracker: Tracker | None = None  # while fitting
        self.last_metrics: dict[str, Any] = {}  # the last logged step metrics (and final validation): the summary
        self.bad_local = 0  # unreadable training images met by this rank in this fit

    # ---- state -------------------------------------------------------------------------------------------------

    def state_dict(self, rng_by_rank: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The training state; `rng_by_rank` holds every rank's generator states (`ckpt.rng_states_by_rank()`, a
        collective), default this process's only. `rng` is rank 0's (what older code reads)."""
        extra = self.objective.extra_state()
        rngs = rng_by_rank if rng_by_rank is not None else [ckpt.rng_state()]
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rngs[0],
            "rng_by_rank": rngs,
            "progress": asdict(self.progress),
            "config": to_container(self.cfg),
            "variant": run_variant(self.cfg),
            **({"objective": extra} if extra else {}),
        }

    def save(self, periodic: bool = False) -> Path:
        """Write `last.pt` (and `step_XXXXXXX.pt` when periodic) atomically on rank 0, then run the callbacks'
        `on_save` (the diagnostics). Weights that are not finite are never written: `NonFiniteLoss` naming the
        last good checkpoint. Every rank calls it: each rank's random state goes into the checkpoint."""
        rngs = ckpt.rng_states_by_rank()
        if self.dist.is_main and (periodic or self._saved_step != self.progress.step or not self.rundir.last.exists()):
            try:
                ckpt.save(self.rundir, self.state_dict(rngs), self.progress.step,
                          periodic and self.cfg.train.keep_periodic)
            except NonFinite as err:
                raise NonFiniteLoss(f"the weights are not finite at step {self.progress.step} (the loss was still "
                                    f"finite) and were not saved; {self.rundir.latest()}. Lower train.lr and relaunch "
                                    f"to resume from it.") from err
            self._saved_step = self.progress.step
            self._emit("on_save")
        return self.rundir.last

    def resume(self) -> bool:
        """Restore everything from the newest usable checkpoint (`last.pt`, else the newest `step_*.pt`); refuse a
        checkpoint of another model or data."""
        found = ckpt.load_for_resume(self.rundir)
        if found is None:
            return False
        path, state = found
        ckpt.check_compatible(state["config"], to_container(self.cfg), path)
        if self.dist.is_main:  # only once the checkpoint is known to fit
            print(f"resuming from {path} at step {state['progress']['step']}", flush=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.objective.load_extra_state(state.get("objective", {}))
        self.progress = Progress(**state["progress"])
        self._saved_step = self.progress.step
        note = ckpt.restore_rng(state, self.dist.rank, self.dist.world,
                                sample_seed(self.cfg.seed, self.progress.step, self.dist.rank))
        if note and self.dist.is_main:
            print(note, flush=True)
        return True

    # ---- one step ----------------------------------------------------------------------------------------------

    def loader(self, epoch: int) -> DataLoader:
        """The training batches of `epoch`, from where the progress stands in it."""
        self.sampler.set_epoch(epoch, self.progress.batch if epoch == self.progress.epoch else 0)
        self.train_set.epoch = epoch
        return DataLoader(
            self.train_set, batch_size=self.sampler.local, sampler=self.sampler, collate_fn=self.objective.collate,
            num_workers=loader_workers(self.cfg.data.num_workers), drop_last=True,
            pin_memory=self.device.type == "cuda",
            generator=torch.Generator().manual_seed(sample_seed(self.cfg.seed, epoch, 1)),  # keeps global RNG intact
        )

    def train_step(self, inputs: list[torch.Tensor], targets: Any) -> dict[str, torch.Tensor]:
        """One optimizer step; returns the logged terms (the first is `loss`)."""
        self.net.train()
        total, terms = self.objective.step_terms(self.net, inputs, targets)
        # one collective for both flags: a NaN anywhere stops every rank, and so does a stop request (a signal
        # may reach the ranks at slightly different times; they must stop after the same step)
        flags = all_reduce_sum(torch.stack([(~torch.isfinite(total.detach())).float(),
                                            torch.tensor(float(self._stop_signal), device=total.device)]))
        self.stop_requested = bool(flags[1].item() > 0)
        if flags[0].item() > 0:
            parts = " ".join(f"{k}={v.item():.4g}" for k, v in terms.items())
            raise NonFiniteLoss(
                f"non-finite loss at step {self.progress.step + 1}: {parts}. Training stopped; {self.rundir.latest()}."
                f" {self.objective.nan_advice} and relaunch to resume from it."
            )
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        if self.cfg.train.grad_clip > 0:  # the backbone and its heads; an online probe is not clipped
            params = [p for n, p in self.model.named_parameters()
                      if p.requires_grad and not n.startswith(self.objective.probe_prefixes)]
            torch.nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return {k: v.detach() for k, v in terms.items()}

    # ---- what callbacks use ------------------------------------------------------------------------------------

    def log(self, metrics: dict[str, Any]) -> None:
        """Log `metrics` at the current step (metrics.jsonl and wandb, main rank)."""
        assert self.tracker is not None, "metrics are logged while fitting"
        self.tracker.log(metrics, self.progress.step)

    def bad_images(self) -> int:
        """Unreadable training images met so far in this fit, summed over the ranks (a collective)."""
        return int(all_reduce_sum(torch.tensor(self.bad_local, device=self.device)).item())

    def request_stop(self) -> None:
        """Stop after the current step with a checkpoint (preemption). Safe from a signal handler: with several
        ranks the request is shared in the next step's collective, so that all ranks stop after the same step."""
        self._stop_signal = True
        if self.dist.world == 1:
            self.stop_requested = True

    def _emit(self, hook: str, *args: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(self, *args)

    def _write_status(self, status: str, **extra: Any) -> None:
        self.rundir.write_status(status, step=self.progress.step, total_steps=self.total_steps,
                                 world_size=self.dist.world, variant=run_variant(self.cfg), **extra)

    # ---- the loop ----------------------------------------------------------------------------------------------

    def fit(self, on_step: Callable[[Trainer], None] | None = None,
            callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
        """Train to the end (resuming from the newest checkpoint if any), with `callbacks` (and `on_step(trainer)`
        after every step) for this fit beside the trainer's own. Returns a summary dict."""
        own = self.callbacks
        self.callbacks = [*own, *callbacks, *([OnStep(on_step)] if on_step is not None else [])]
        self.rundir.lock()
        try:
            return self._fit()
        finally:
            self.rundir.unlock()
            self.callbacks = own

    def _fit(self) -> dict[str, Any]:
        self.resume()
        self.rundir.start(self.cfg)
        self._write_status("running")
        self.tracker = Tracker(self.run_dir, self.cfg.wandb, self.cfg.name, to_container(self.cfg),
                               active=self.dist.is_main, resume_step=self.progress.step)
        self.last_metrics, self.bad_local = last_logged(self.run_dir, self.progress.step), 0
        p = self.progress
        try:
            self._emit("on_fit_start")
            while p.step < self.total_steps and not self.stop_requested:
                for inputs, targets, n_bad in self.loader(p.epoch):
                    self.bad_local += n_bad  # this rank's; summed over ranks when logged
                    p.batch += 1
                    if not inputs:
                        continue
                    self._emit("on_step_start")
                    terms = self.train_step(inputs, targets)
                    p.step += 1
                    self._emit("on_step_end", terms)
                    if p.step >= self.total_steps or self.stop_requested:
                        break
                else:  # the epoch ran out
                    p.epoch, p.batch = p.epoch + 1, 0
                    self._emit("on_epoch_end", p.epoch - 1)
            status = "interrupted" if self.stop_requested and p.step < self.total_steps else "finished"
            self._emit("on_fit_end", status)
        except BaseException as err:
            self._write_status("failed" if isinstance(err, Exception) else "interrupted", error=str(err))
            raise
        finally:
            self._emit("close")
            self.tracker.finish()
            self.tracker = None
        self._write_status(status)
        return {"status": status, "step": p.step, "run_dir": str(self.run_dir), "bad_images": self.bad_images(),
                **self.last_metrics}


def last_logged(run_dir: Path, step: int) -> dict[str, Any]:
    """The last metrics line logged at or before `step` with a loss (what a relaunch of a finished run reports)."""
    lines = [m for m in read_metrics(run_dir) if "loss" in m and m["step"] <= step]
    return {k: v for k, v in lines[-1].items() if k != "step"} if lines else {}
