"""Training: one `Trainer` for CPU, one GPU, or DDP over many, with exact resume from `last.pt`. The objective owns
the model around the backbone, the batches and the loss; logging, validation, checkpoints and diagnostics are
callbacks (`vitsinks.train.callbacks`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from vitsinks.configs.schema import to_container
from vitsinks.configs.upgrade import saved
from vitsinks.data import build_dataset, num_classes
from vitsinks.data.crops import EpochSampler, sample_seed
from vitsinks.data.loading import device_batches, train_loader
from vitsinks.models import SinkViT, model_from_config, run_variant
from vitsinks.objectives import Runtime, build_objective
from vitsinks.train import checkpoint as ckpt
from vitsinks.train.callbacks import Callback, OnStep, default_callbacks
from vitsinks.train.optim import build_optimizer, load_optimizer_state
from vitsinks.train.tracking import Tracker
from vitsinks.utils.cpus import compute_threads, cpu_threads, loader_workers
from vitsinks.utils.distributed import DistInfo, all_reduce_max, all_reduce_sum, init_distributed
from vitsinks.utils.errors import ConfigError, NonFinite
from vitsinks.utils.metrics_log import read_metrics
from vitsinks.utils.rundir import RunDir


class NonFiniteLoss(NonFinite):
    """The loss (or the weights) became NaN or infinite; the last good checkpoint is kept."""


@dataclass
class Progress:
    """Where training stands: epoch, batches done in that epoch, optimizer steps done in total."""

    epoch: int = 0
    batch: int = 0
    step: int = 0


@dataclass
class LoopClock:
    """Wall time of the loop since the fit started: waiting for the loader (`wait_s`) and stepping (`step_s`), as
    the host sees it."""

    wait_s: float = 0.0
    step_s: float = 0.0
    mark: float = 0.0

    def ready(self) -> None:
        """The loop asks for the next batch."""
        self.mark = time.perf_counter()

    def got_batch(self) -> None:
        now = time.perf_counter()
        self.wait_s, self.mark = self.wait_s + now - self.mark, now

    def stepped(self) -> None:
        now = time.perf_counter()
        self.step_s, self.mark = self.step_s + now - self.mark, now


# `Trainer._first_bad` when every loss so far was finite (steps count from 1)
ALL_FINITE = 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """Owns the model, data, optimizer and run directory of one training run."""

    def __init__(self, cfg: DictConfig, dist_info: DistInfo | None = None,
                 callbacks: Sequence[Callback] = ()) -> None:
        self.cfg = cfg
        self.dist = dist_info or init_distributed(cfg.cluster.device)
        self.device = self.dist.device
        self.rundir = RunDir(Path(cfg.runs_dir) / cfg.name, self.dist.is_main)
        self.run_dir = self.rundir.path
        if cfg.train.precision == "bf16" and self.device.type != "cuda":
            raise ConfigError("train.precision=bf16 needs CUDA (bf16 autocast runs on GPUs only): use auto or fp32")
        self.bf16 = self.device.type == "cuda" and cfg.train.precision in ("auto", "bf16")
        seed_everything(cfg.seed + self.dist.rank)

        self.objective = build_objective(cfg, Runtime(self.device, self.bf16, self.dist.world))
        base = build_dataset(cfg.data, "train", cfg.seed)
        self.val_set = build_dataset(cfg.data, "val", cfg.seed)
        self.num_classes = num_classes(base)
        self.train_set = self.objective.train_samples(base)
        self.objective.watch(base, self.num_classes)  # the monitors' k-NN bank: training images
        self.sampler = EpochSampler(len(base), cfg.train.batch_size,  # type: ignore[arg-type]  # a sized Dataset
                                    cfg.seed, self.dist.rank, self.dist.world)
        # CPU training's compute threads (`compute_threads`): part of what a bit-identical rerun needs
        self.cpu_threads = compute_threads(cfg.train.cpu_threads, loader_workers(cfg.data.num_workers))
        self.total_steps = self.sampler.batches_per_epoch * cfg.train.epochs
        if cfg.train.max_steps:
            self.total_steps = min(self.total_steps, cfg.train.max_steps)

        self.model = self.objective.setup_model(model_from_config(cfg.model), self.num_classes)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg, self.sampler.batches_per_epoch,
                                                         self.total_steps, self.objective.probe_prefixes, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)  # bf16 needs no loss scaling
        self.backbone.set_grad_checkpointing(cfg.train.grad_checkpointing)
        if cfg.train.compile:  # each block in place, before DDP: parameter names, hooks and state dicts stay eager's
            for block in self.backbone.blocks:
                block.compile()
        self.net: torch.nn.Module = self.model
        if self.dist.world > 1:  # every objective uses the same parameters in every step: a static graph
            self.net = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                gradient_as_bucket_view=True, static_graph=cfg.train.ddp_static_graph)
        self.callbacks: list[Callback] = [*default_callbacks(), *callbacks]
        self.progress = Progress()
        self.stop_requested = False  # the decision, identical on all ranks
        self._stop_signal = False  # this rank's request
        self._saved_step = -1
        # On the device, written by every step without a host sync, read by `check_flags`: the first step whose
        # loss was not finite (ALL_FINITE: none) and that step's logged terms
        self._first_bad = torch.full((), ALL_FINITE, dtype=torch.long, device=self.device)
        self._bad_terms: torch.Tensor | None = None
        self._term_names: list[str] = []
        self.clock = LoopClock()
        self._train_loader: DataLoader | None = None  # one for the fit (`loader`)
        self.tracker: Tracker | None = None  # while fitting
        self.last_metrics: dict[str, Any] = {}  # the last logged step metrics (and final validation): the summary
        self.bad_local = 0  # unreadable training images met by this rank in this fit

    @property
    def backbone(self) -> SinkViT:
        """The ViT being trained: the backbone of the objective's model (`Objective.build_model`)."""
        return cast(SinkViT, self.model.backbone)

    # ---- state -------------------------------------------------------------------------------------------------

    def state_dict(self, rng_by_rank: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The training state; `rng_by_rank`: every rank's generator states (default this process's only)."""
        extra = self.objective.extra_state()
        rngs = rng_by_rank if rng_by_rank is not None else [ckpt.rng_state()]
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(), "rng": rngs[0],
                "rng_by_rank": rngs, "progress": asdict(self.progress), "config": saved(self.cfg),
                "variant": run_variant(self.cfg), **({"objective": extra} if extra else {})}

    def save(self, periodic: bool = False) -> Path:
        """Write `last.pt` (and `step_XXXXXXX.pt` when periodic) on rank 0, then run `on_save`; non-finite weights
        or losses raise `NonFiniteLoss`. Every rank calls it."""
        self.check_flags()
        rngs = ckpt.rng_states_by_rank()
        # rank 0's weights are saved: their verdict is shared, so that every rank stops together
        bad = float(self.dist.is_main and bool(ckpt.non_finite(self.model.state_dict())))
        if all_reduce_max(torch.tensor(bad, device=self.device)).item() > 0:
            raise NonFiniteLoss(f"the weights are not finite at step {self.progress.step} (the loss was still "
                                f"finite) and were not saved; {self.rundir.latest()}. Lower train.lr and relaunch "
                                f"to resume from it.")
        if self.dist.is_main and (periodic or self._saved_step != self.progress.step or not self.rundir.last.exists()):
            ckpt.save(self.rundir, self.state_dict(rngs), self.progress.step,
                      periodic and self.cfg.train.keep_periodic, self.cfg.train.periodic_weights_only)
            self._saved_step = self.progress.step
            self._emit("on_save")
        return self.rundir.last

    def resume(self) -> bool:
        """Restore everything from the newest usable checkpoint; refuse one of another model or data."""
        found = ckpt.load_for_resume(self.rundir)
        if found is None:
            return False
        path, state = found
        ckpt.check_compatible(state["config"], to_container(self.cfg), path)
        if self.dist.is_main:  # only once the checkpoint is known to fit
            print(f"resuming from {path} at step {state['progress']['step']}", flush=True)
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"])
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

    def loader(self, epoch: int) -> Iterable[Any]:
        """The training batches of `epoch`, from where the progress stands in it."""
        self.sampler.set_epoch(epoch, self.progress.batch if epoch == self.progress.epoch else 0)
        if self._train_loader is None:  # built on first use
            self._train_loader = train_loader(
                self.train_set, self.sampler, self.objective.collate, loader_workers(self.cfg.data.num_workers),
                self.cfg.data.prefetch_factor, self.device, self.cfg.seed)
        return device_batches(self._train_loader, self.device)

    def train_step(self, inputs: list[torch.Tensor], targets: Any) -> dict[str, torch.Tensor]:
        """One optimizer step, without waiting for the device; returns the logged terms (the first is `loss`)."""
        self.net.train()
        total, terms = self.objective.step_terms(self.net, inputs, targets)
        self._record_finite(total.detach(), terms)
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        if self.objective.penalty is not None:  # what a recomputation (train.grad_checkpointing) recorded again
            self.objective.penalty.reset()
        if self.cfg.train.grad_clip > 0:  # the backbone and its heads; an online probe is not clipped
            params = [p for n, p in self.model.named_parameters()
                      if p.requires_grad and not n.startswith(self.objective.probe_prefixes)]
            torch.nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return {k: v.detach() for k, v in terms.items()}

    def _record_finite(self, loss: torch.Tensor, terms: dict[str, torch.Tensor]) -> None:
        """Keep, on the device, the number and terms of the first step whose loss is not finite."""
        values = torch.stack([v.detach().float() for v in terms.values()])
        if self._bad_terms is None or self._term_names != list(terms):
            self._bad_terms, self._term_names = torch.zeros_like(values), list(terms)
        first = ~torch.isfinite(loss) & (self._first_bad == ALL_FINITE)
        self._first_bad.masked_fill_(first, self.progress.step + 1)
        self._bad_terms = torch.where(first, values, self._bad_terms)

    def check_flags(self) -> None:
        """Act on what the steps recorded: a non-finite loss is `NonFiniteLoss`, a stop request stops every rank."""
        never = torch.iinfo(torch.long).max
        first = torch.where(self._first_bad == ALL_FINITE, never, self._first_bad)
        # one maximum over ranks for both: the earliest bad step (negated) and whether any rank was asked to stop
        bad, stop = all_reduce_max(torch.stack([-first, torch.full_like(first, int(self._stop_signal))])).tolist()
        self.stop_requested = self.stop_requested or stop > 0
        if bad == -never:
            return
        step = -bad
        if int(self._first_bad) == step and self._bad_terms is not None:
            parts = " ".join(f"{k}={v:.4g}" for k, v in zip(self._term_names, self._bad_terms.tolist(), strict=True))
        else:
            parts = "on another rank"
        raise NonFiniteLoss(f"non-finite loss at step {step}: {parts}. Training stopped; {self.rundir.latest()}. "
                            f"{self.objective.nan_advice} and relaunch to resume from it.")

    # ---- what callbacks use ------------------------------------------------------------------------------------

    def log(self, metrics: dict[str, Any]) -> None:
        """Log `metrics` at the current step (metrics.jsonl and wandb, main rank)."""
        assert self.tracker is not None, "metrics are logged while fitting"
        self.tracker.log(metrics, self.progress.step)

    def bad_images(self) -> int:
        """Unreadable training images met so far in this fit, summed over the ranks (a collective)."""
        return int(all_reduce_sum(torch.tensor(self.bad_local, device=self.device)).item())

    def request_stop(self) -> None:
        """Stop after the current step with a checkpoint (every rank after the same step); signal-safe."""
        self._stop_signal = True
        if self.dist.world == 1:
            self.stop_requested = True

    def _emit(self, hook: str, *args: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(self, *args)

    def write_status(self, status: str, quiet: bool = False, **extra: Any) -> None:
        """`status.json` (rank 0) with the run's facts and `extra`; `quiet`: a failure to write warns."""
        info = {"step": self.progress.step, "total_steps": self.total_steps, "world_size": self.dist.world,
                "variant": run_variant(self.cfg),
                **({"cpu_threads": self.cpu_threads} if self.device.type == "cpu" else {}), **extra}
        self.rundir.write_status(status, quiet=quiet, **info)

    # ---- the loop ----------------------------------------------------------------------------------------------

    def fit(self, on_step: Callable[[Trainer], None] | None = None,
            callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
        """Train to the end (resuming), with `callbacks` (and `on_step`) for this fit; returns a summary dict."""
        own = self.callbacks
        self.callbacks = [*own, *callbacks, *([OnStep(on_step)] if on_step is not None else [])]
        self.rundir.lock()
        try:
            with cpu_threads(self.cfg, self.device):
                return self._fit()
        finally:
            self.rundir.unlock()
            self.callbacks = own
            self._train_loader = None  # its persistent workers end with the fit (a later fit builds a new one)

    def _fit(self) -> dict[str, Any]:
        self.resume()
        self.rundir.start(saved(self.cfg))
        self.write_status("running")
        p = self.progress
        self._first_bad.fill_(ALL_FINITE)
        try:
            self.tracker = Tracker(self.run_dir, self.cfg.wandb, self.cfg.name, to_container(self.cfg),
                                   active=self.dist.is_main, resume_step=self.progress.step)
            self.last_metrics, self.bad_local = last_logged(self.run_dir, self.progress.step), 0
            self._emit("on_fit_start")
            self.clock = LoopClock()
            self.clock.ready()
            while p.step < self.total_steps and not self.stop_requested:
                for inputs, targets, n_bad in self.loader(p.epoch):
                    self.clock.got_batch()
                    self.bad_local += n_bad  # this rank's; summed over ranks when logged
                    p.batch += 1
                    if not inputs:
                        continue
                    self._emit("on_step_start")
                    terms = self.train_step(inputs, targets)
                    p.step += 1
                    if p.step % self.cfg.train.log_every == 0 or p.step == self.total_steps:
                        self.check_flags()  # before the step's metrics are logged
                    self.clock.stepped()
                    self._emit("on_step_end", terms)
                    if p.step >= self.total_steps or self.stop_requested:
                        break
                    self.clock.ready()
                else:  # the epoch ran out
                    p.epoch, p.batch = p.epoch + 1, 0
                    self.check_flags()  # before the epoch's validation
                    self._emit("on_epoch_end", p.epoch - 1)
                    self.clock.ready()
            self.check_flags()
            status = "interrupted" if self.stop_requested and p.step < self.total_steps else "finished"
            self._emit("on_fit_end", status)
        except BaseException as err:
            # the step a relaunch resumes from, not the step reached (its weights were never saved)
            self.write_status("failed" if isinstance(err, Exception) else "interrupted", error=str(err),
                              step=max(self._saved_step, 0), reached=p.step, quiet=True)
            raise
        finally:
            self._emit("close")
            if self.tracker is not None:
                self.tracker.finish()
            self.tracker = None
        self.write_status(status)
        return {"status": status, "step": p.step, "run_dir": str(self.run_dir), "bad_images": self.bad_images(),
                **self.last_metrics}


def last_logged(run_dir: Path, step: int) -> dict[str, Any]:
    """The last metrics line logged at or before `step` with a loss (what a relaunch of a finished run reports)."""
    lines = [m for m in read_metrics(run_dir) if "loss" in m and m["step"] <= step]
    return {k: v for k, v in lines[-1].items() if k != "step"} if lines else {}
