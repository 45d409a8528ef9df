"""What `Trainer.fit` does beside the loop, as callbacks: metrics and the progress bar, validation, checkpointing,
the sink diagnostics of every saved checkpoint, and the step in `status.json`. The hooks run in the order of the
trainer's callback list (exact resume relies on it), on every rank except `on_save` (main rank only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm import tqdm

from vitsinks.backbones import adapt
from vitsinks.diagnostics import fixed_images, run_diagnostics
from vitsinks.train.checkpoint import load_backbone
from vitsinks.utils.distributed import all_reduce_sum, gather_objects
from vitsinks.utils.errors import BadValue, UserError
from vitsinks.utils.progress import hidden

if TYPE_CHECKING:  # annotations only: the trainer imports this module
    from vitsinks.train.trainer import Trainer


class Callback:
    """Hooks into `Trainer.fit`; each is a no-op unless overridden."""

    def on_fit_start(self, trainer: Trainer) -> None:
        """After resuming, before the first step."""

    def on_step_start(self, trainer: Trainer) -> None:
        """Before an optimizer step."""

    def on_step_end(self, trainer: Trainer, terms: dict[str, torch.Tensor]) -> None:
        """After an optimizer step (`trainer.progress.step` counts it); `terms`: its detached logged terms."""

    def on_epoch_end(self, trainer: Trainer, epoch: int) -> None:
        """After the last batch of `epoch` (the progress already points at the start of the next one)."""

    def on_save(self, trainer: Trainer) -> None:
        """After a checkpoint of the current step was written (main rank only)."""

    def on_fit_end(self, trainer: Trainer, status: str) -> None:
        """After the loop: `status` is `finished` or `interrupted` (a stop request)."""

    def close(self, trainer: Trainer) -> None:
        """When `fit` returns or raises: release what the callback holds."""


class StepMetrics(Callback):
    """Every `train.log_every` steps (and at the last): the terms averaged over the ranks, the lr, the throughput
    (`img_per_s`), the loader wait share (`data_wait`) and the unreadable images, to the tracker and the bar."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None
        self.since: tuple[int, float, float] = (0, 0.0, 0.0)  # (step, wait_s, step_s) at the last log

    def on_fit_start(self, trainer: Trainer) -> None:
        self.bar = tqdm(total=trainer.total_steps, initial=trainer.progress.step, desc=trainer.cfg.name, unit="step",
                        disable=hidden(not trainer.dist.is_main), dynamic_ncols=True)
        self.since = (trainer.progress.step, 0.0, 0.0)  # the trainer's clock starts at zero after this hook

    def on_step_end(self, trainer: Trainer, terms: dict[str, torch.Tensor]) -> None:
        assert self.bar is not None
        self.bar.update(1)
        step = trainer.progress.step
        if step % trainer.cfg.train.log_every and step != trainer.total_steps:
            return
        parts = (all_reduce_sum(torch.stack(list(terms.values())).float()) / trainer.dist.world).tolist()
        clock = trainer.clock
        steps, wait, busy = step - self.since[0], clock.wait_s - self.since[1], clock.step_s - self.since[2]
        self.since = (step, clock.wait_s, clock.step_s)
        wall = max(wait + busy, 1e-9)
        metrics = {"epoch": trainer.progress.epoch, **dict(zip(terms, parts, strict=True)),
                   "lr": trainer.scheduler.get_last_lr()[0],
                   "img_per_s": trainer.cfg.train.batch_size * steps / wall, "data_wait": wait / wall,
                   "bad_images": trainer.bad_images()}
        trainer.log(metrics)
        trainer.last_metrics = metrics
        shown = metrics.get(trainer.objective.bar_metric) if trainer.objective.bar_metric else None
        acc: dict[str, Any] = {} if shown is None else {"acc": f"{shown:.2f}"}
        self.bar.set_postfix(loss=f"{metrics['loss']:.4f}", img_s=f"{metrics['img_per_s']:.0f}",
                             wait=f"{metrics['data_wait']:.0%}", **acc)

    def close(self, trainer: Trainer) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Validation(Callback):
    """The objective's validation at every epoch end and, when training finished, once more at the end."""

    def on_epoch_end(self, trainer: Trainer, epoch: int) -> None:
        trainer.log({"epoch": epoch, **trainer.objective.validate(trainer.model, trainer.val_set)})

    def on_fit_end(self, trainer: Trainer, status: str) -> None:
        if status != "finished":
            return
        val = self.logged(trainer)
        if val is None:
            val = trainer.objective.validate(trainer.model, trainer.val_set)
            trainer.log({"epoch": trainer.progress.epoch, **val})
        trainer.last_metrics.update(val)

    @staticmethod
    def logged(trainer: Trainer) -> dict[str, Any] | None:
        """The final validation metrics.jsonl holds already, on every rank (a collective); None if none."""
        assert trainer.tracker is not None, "validation is logged while fitting"
        lines = [m for m in trainer.tracker.logged_at(trainer.progress.step) if any(k.startswith("val/") for k in m)]
        return gather_objects({k: v for k, v in lines[-1].items() if k.startswith("val/")} if lines else None)[0]


class Checkpointing(Callback):
    """`last.pt` (and `step_XXXXXXX.pt`) every `train.ckpt_every` steps, at every epoch end and the end."""

    def on_step_end(self, trainer: Trainer, terms: dict[str, torch.Tensor]) -> None:
        if trainer.progress.step % trainer.cfg.train.ckpt_every == 0:
            trainer.save(periodic=True)

    def on_epoch_end(self, trainer: Trainer, epoch: int) -> None:
        trainer.save()

    def on_fit_end(self, trainer: Trainer, status: str) -> None:
        trainer.save()


class Diagnostics(Callback):
    """Sink diagnostics of every saved checkpoint (`diagnostics.enabled`) on fixed validation images; a diagnosis
    a kill interrupted is redone on resume from the step's checkpoint, or named as missing."""

    def __init__(self) -> None:
        self.images: tuple[torch.Tensor, np.ndarray, list[int]] | None = None

    def on_fit_start(self, trainer: Trainer) -> None:
        if not trainer.cfg.diagnostics.enabled or not trainer.dist.is_main:
            return
        run = trainer.rundir
        for step, folder in sorted(run.step_diagnostics_dirs().items()):
            if run.summary(folder.name).exists() or step > trainer.progress.step:  # a later step: diagnosed again
                continue
            if step == trainer.progress.step:
                print(f"redoing the diagnosis of step {step}, which was interrupted", flush=True)
                self.diagnose(trainer, trainer.backbone, folder)
            elif (path := run.step_checkpoint(step)).is_file():
                print(f"redoing the diagnosis of step {step}, which was interrupted, from {path.name}", flush=True)
                try:
                    backbone = load_backbone(path)[0].to(trainer.device)
                except UserError as err:  # a damaged periodic checkpoint: training goes on without it
                    print(f"warning: step {step} stays undiagnosed: {err}", flush=True)
                    continue
                self.diagnose(trainer, backbone, folder)
            else:
                print(f"warning: the diagnosis of step {step} was interrupted and its checkpoint was not kept "
                      f"(train.keep_periodic=false): step {step} is missing from {run.diagnostics_root}", flush=True)

    def on_save(self, trainer: Trainer) -> None:
        run = trainer.rundir
        out = run.step_diagnostics(trainer.progress.step)
        if trainer.cfg.diagnostics.enabled and not run.summary(out.name).exists():
            self.diagnose(trainer, trainer.backbone, out)

    def diagnose(self, trainer: Trainer, backbone: torch.nn.Module, out: Path) -> None:
        """Diagnose `backbone` into `out`; a diagnosis that cannot be made is a warning."""
        d, cfg = trainer.cfg.diagnostics, trainer.cfg
        if self.images is None:
            self.images = fixed_images(trainer.val_set, d.n_images, cfg.views.global_size, cfg.data.on_bad_image,
                                       cfg.selection)
        images, shown, index = self.images
        try:
            run_diagnostics(adapt(backbone), images, shown, out, d, index, cfg.selection)
        except BadValue as err:
            print(f"warning: {out.name} not diagnosed: {err} (python -m vitsinks.diagnose run={trainer.run_dir} "
                  f"diagnoses it later)", flush=True)


class StatusFile(Callback):
    """`status.json` (`running`, with the step) rewritten during training at most every `every_s` seconds."""

    every_s: float = 10.0  # a rewrite costs one small fsync'd file

    def __init__(self) -> None:
        self.last = 0.0

    def on_fit_start(self, trainer: Trainer) -> None:
        self.last = time.monotonic()  # the trainer has just written `running` at the resumed step

    def on_step_end(self, trainer: Trainer, terms: dict[str, torch.Tensor]) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s and trainer.progress.step < trainer.total_steps:
            trainer.write_status("running")
            self.last = now


class OnStep(Callback):
    """Calls `fn(trainer)` after every step (after the step's metrics and checkpoint)."""

    def __init__(self, fn: Callable[[Trainer], Any]) -> None:
        self.fn = fn

    def on_step_end(self, trainer: Trainer, terms: dict[str, torch.Tensor]) -> None:
        self.fn(trainer)


def default_callbacks() -> list[Callback]:
    """The trainer's own callbacks, in the order they run."""
    return [StepMetrics(), Validation(), Checkpointing(), Diagnostics(), StatusFile()]
