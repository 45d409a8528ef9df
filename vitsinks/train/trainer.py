"""Training: one `Trainer` for CPU, one GPU, or DDP over many, with exact resume from `last.pt`.

The objective is LeJEPA (multi-crop views, the default) or `supervised` (the dataset's own targets, see
`vitsinks.objectives.supervised`); everything else (optimizer, schedule, checkpoints, diagnostics, status) is shared.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from vitsinks.configs.schema import to_container
from vitsinks.data import build_dataset, is_sink_task, loader_workers, num_classes, read_item
from vitsinks.data.selection import permutation
from vitsinks.data.views import EpochSampler, SeededViews, collate_views, sample_seed, view_transform
from vitsinks.diagnostics import fixed_images, protocol_transform, run_diagnostics
from vitsinks.models import model_from_config, run_variant
from vitsinks.objectives import supervised as sup
from vitsinks.objectives.lejepa import CommonModePenalty, LeJEPAModel, LeJEPAObjective, LossTerms
from vitsinks.train import checkpoint as ckpt
from vitsinks.train.optim import build_optimizer
from vitsinks.train.tracking import Tracker
from vitsinks.utils.distributed import DistInfo, all_reduce_sum, init_distributed, sync_batchnorm
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
    """Owns the model, data, optimizer and run directory of one training run (LeJEPA or supervised)."""

    def __init__(self, cfg: DictConfig, dist_info: DistInfo | None = None) -> None:
        self.cfg = cfg
        self.dist = dist_info or init_distributed(cfg.cluster.device)
        self.device = self.dist.device
        self.rundir = RunDir(Path(cfg.runs_dir) / cfg.name, self.dist.is_main)
        self.run_dir, self.ckpt_dir = self.rundir.path, self.rundir.ckpt_dir
        if cfg.train.precision == "bf16" and self.device.type != "cuda":
            raise ConfigError("train.precision=bf16 needs CUDA (bf16 autocast runs on GPUs only): use auto or fp32")
        self.bf16 = self.device.type == "cuda" and cfg.train.precision in ("auto", "bf16")
        seed_everything(cfg.seed + self.dist.rank)

        self.supervised = cfg.objective.name == "supervised"
        if is_sink_task(cfg.data.name) and not self.supervised:
            raise ConfigError(f"data={cfg.data.name} has per-patch targets, not images for LeJEPA views: train it "
                              "with objective=supervised")
        base = build_dataset(cfg.data, "train", cfg.seed)
        self.val_set = build_dataset(cfg.data, "val", cfg.seed)
        self.num_classes = num_classes(base)
        policy = cfg.data.on_bad_image
        if self.supervised:
            self.train_set = sup.SupervisedSamples(base, cfg.views.global_size, policy)
            self.val_samples = sup.SupervisedSamples(self.val_set, cfg.views.global_size, policy)
        else:
            self.train_set = SeededViews(base, view_transform(cfg.views), cfg.seed, policy)
        self.sampler = EpochSampler(len(base), cfg.train.batch_size, cfg.seed, self.dist.rank, self.dist.world)
        self.total_steps = self.sampler.batches_per_epoch * cfg.train.epochs
        if cfg.train.max_steps:
            self.total_steps = min(self.total_steps, cfg.train.max_steps)

        backbone = model_from_config(cfg.model)
        if self.supervised:
            self.model: torch.nn.Module = sup.SupervisedModel(backbone, self.num_classes).to(self.device)
        else:
            self.model = LeJEPAModel(backbone, cfg.objective, self.num_classes).to(self.device)
            self.objective = LeJEPAObjective(cfg.objective, gather_distributed=self.dist.world > 1).to(self.device)
        if cfg.objective.get("projector_bn", "global_batch") == "global_batch":  # per_rank: plain BatchNorm per GPU
            sync_batchnorm(self.model, self.device)
        self.cm_penalty = CommonModePenalty(backbone.blocks, cfg.objective) if cfg.objective.cm_penalty else None
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg, self.sampler.batches_per_epoch,
                                                         self.total_steps)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)  # bf16 needs no loss scaling
        self.net: torch.nn.Module = self.model
        if self.dist.world > 1:
            self.net = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if cfg.train.compile:
            self.net = torch.compile(self.net)
        self.progress = Progress()
        self.stop_requested = False  # the decision, identical on all ranks
        self._stop_signal = False  # this rank's request
        self._saved_step = -1
        self._diag_images: tuple[torch.Tensor, np.ndarray] | None = None

    # ---- state -------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": ckpt.rng_state(),
            "progress": asdict(self.progress),
            "config": to_container(self.cfg),
            "variant": run_variant(self.cfg),
        }

    def save(self, periodic: bool = False) -> Path:
        """Write `last.pt` (and `step_XXXXXXX.pt` when periodic) atomically on rank 0, then diagnose it. Weights
        that are not finite are never written: `NonFiniteLoss` naming the last good checkpoint."""
        if self.dist.is_main and (periodic or self._saved_step != self.progress.step or not self.rundir.last.exists()):
            try:
                ckpt.save(self.rundir, self.state_dict(), self.progress.step, periodic and self.cfg.train.keep_periodic)
            except NonFinite as err:
                raise NonFiniteLoss(f"the weights are not finite at step {self.progress.step} (the loss was still "
                                    f"finite) and were not saved; {self.rundir.latest()}. Lower train.lr and relaunch "
                                    f"to resume from it.") from err
            self._saved_step = self.progress.step
            self._diagnose()
        return self.rundir.last

    def _diagnose(self) -> None:
        """Sink diagnostics of the current weights into `<run>/diagnostics/step_XXXXXXX/` (rank 0, once a step)."""
        d = self.cfg.diagnostics
        out = self.run_dir / "diagnostics" / f"step_{self.progress.step:07d}"
        if not d.enabled or (out / "summary.json").exists():
            return
        if self._diag_images is None:
            self._diag_images = fixed_images(self.val_set, d.n_images, self.cfg.views.global_size,
                                             self.cfg.data.on_bad_image, self.cfg.protocol)
        images, shown, index = self._diag_images
        run_diagnostics(self.model.backbone, images, shown, out, d, index, self.cfg.protocol)

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
        self.progress = Progress(**state["progress"])
        self._saved_step = self.progress.step
        rng = state["rng"]
        if self.dist.rank:  # per-rank streams: offset the saved rank-0 state deterministically
            rng = {**rng, "torch": torch.Generator().manual_seed(
                sample_seed(self.cfg.seed, self.progress.step, self.dist.rank)).get_state()}
        ckpt.set_rng_state(rng)
        return True

    # ---- one step ----------------------------------------------------------------------------------------------

    def _loader(self, epoch: int) -> DataLoader:
        self.sampler.set_epoch(epoch, self.progress.batch if epoch == self.progress.epoch else 0)
        self.train_set.epoch = epoch
        return DataLoader(
            self.train_set, batch_size=self.sampler.local, sampler=self.sampler,
            collate_fn=sup.collate_supervised if self.supervised else collate_views,
            num_workers=loader_workers(self.cfg.data.num_workers), drop_last=True,
            pin_memory=self.device.type == "cuda",
            generator=torch.Generator().manual_seed(sample_seed(self.cfg.seed, epoch, 1)),  # keeps global RNG intact
        )

    def _lejepa_terms(self, views: list[torch.Tensor], labels: torch.Tensor) -> tuple[torch.Tensor,
                                                                                      dict[str, torch.Tensor]]:
        """(total loss to minimise, logged terms) of one LeJEPA batch: the objective plus the online probe."""
        n_global = self.cfg.views.n_global
        views = [v.to(self.device, non_blocking=True) for v in views]
        labels = labels.to(self.device).repeat(n_global)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            proj_g, proj_l, logits = self.net(views, n_global)
        terms: LossTerms = self.objective(proj_g.float(), None if proj_l is None else proj_l.float())
        probe_loss = F.cross_entropy(logits.float(), labels)
        acc = (logits.argmax(-1) == labels).float().mean()
        return terms.loss + probe_loss, {"loss": terms.loss, "sigreg": terms.sigreg, "invariance": terms.invariance,
                                         "probe_loss": probe_loss, "probe_acc": acc}

    def _supervised_terms(self, images: list[torch.Tensor], targets: Any) -> tuple[torch.Tensor,
                                                                                   dict[str, torch.Tensor]]:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out = self.net(images[0].to(self.device, non_blocking=True))
        terms = sup.supervised_loss(self.model, out, sup.to_device(targets, self.device))
        return terms["loss"], terms

    def train_step(self, views: list[torch.Tensor], labels: Any) -> dict[str, torch.Tensor]:
        """One optimizer step; returns the logged terms (the first is `loss`)."""
        self.net.train()
        if self.cm_penalty:
            self.cm_penalty.reset()
        if self.supervised:
            total, terms = self._supervised_terms(views, labels)
        else:
            total, terms = self._lejepa_terms(views, labels)
        if self.cm_penalty:
            extra, cm_terms = self.cm_penalty()
            total = total + extra
            terms.update(cm_terms)
        # one collective for both flags: a NaN anywhere stops every rank, and so does a stop request (a signal
        # may reach the ranks at slightly different times; they must stop after the same step)
        flags = all_reduce_sum(torch.stack([(~torch.isfinite(total.detach())).float(),
                                            torch.tensor(float(self._stop_signal), device=total.device)]))
        self.stop_requested = bool(flags[1].item() > 0)
        if flags[0].item() > 0:
            parts = " ".join(f"{k}={v.item():.4g}" for k, v in terms.items())
            raise NonFiniteLoss(
                f"non-finite loss at step {self.progress.step + 1}: {parts}. Training stopped; {self.rundir.latest()}."
                f" Lower train.lr (LeJEPA: or raise objective.lamb) and relaunch to resume from it."
            )
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        if self.cfg.train.grad_clip > 0:  # the backbone and its heads; the online probe is not clipped
            params = [p for n, p in self.model.named_parameters() if p.requires_grad and not n.startswith("probe.")]
            torch.nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return {k: v.detach() for k, v in terms.items()}

    # ---- validation and logging --------------------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        """Validation metrics: `val/probe_acc` (LeJEPA's online probe), `val/top1` or `val/rel_error`."""
        if self.supervised:
            return sup.evaluate(self.model, self.val_samples, self.device, self.bf16)
        return {"val/probe_acc": self.probe_accuracy()}

    @torch.no_grad()
    def probe_accuracy(self, max_images: int = 2048) -> float:
        """Top-1 of the online probe on (up to `max_images` of, in the seeded order of `protocol`) the validation
        split, centre view; unreadable
        images are skipped under `data.on_bad_image=skip`."""
        self.model.eval()
        tf = protocol_transform(self.cfg.views.global_size, self.cfg.protocol)
        order = permutation(len(self.val_set), self.cfg.protocol.seed)[:max_images]  # never one class's images
        correct = total = 0
        for lo in range(0, len(order), 256):
            items = [it for i in order[lo : lo + 256]
                     if (it := read_item(self.val_set, i, self.cfg.data.on_bad_image)) is not None]
            if not items:
                continue
            x = torch.stack([tf(img) for img, _ in items]).to(self.device)
            y = torch.tensor([label for _, label in items], device=self.device)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                logits = self.model.probe(self.model.backbone(x))
            correct += int((logits.argmax(-1) == y).sum())
            total += len(items)
        return correct / max(total, 1)

    def _log_step(self, tracker: Tracker, terms: dict[str, torch.Tensor], t0: float, bad_local: int,
                  bar: tqdm) -> dict[str, Any]:
        """Means of the step's terms over the global batch, the lr, throughput and unreadable images: to the
        tracker and the progress bar."""
        p = self.progress
        parts = (all_reduce_sum(torch.stack(list(terms.values())).float()) / self.dist.world).tolist()
        metrics = {"epoch": p.epoch, **dict(zip(terms, parts, strict=True)), "lr": self.scheduler.get_last_lr()[0],
                   "img_per_s": self.cfg.train.batch_size / (time.perf_counter() - t0),
                   "bad_images": int(all_reduce_sum(torch.tensor(bad_local, device=self.device)).item())}
        tracker.log(metrics, p.step)
        acc = metrics.get("probe_acc", metrics.get("acc"))
        bar.set_postfix(loss=f"{metrics['loss']:.4f}", img_s=f"{metrics['img_per_s']:.0f}",
                        **({} if acc is None else {"acc": f"{acc:.2f}"}))
        return metrics

    def request_stop(self) -> None:
        """Stop after the current step with a checkpoint (preemption). Safe from a signal handler: with several
        ranks the request is shared in the next step's collective, so that all ranks stop after the same step."""
        self._stop_signal = True
        if self.dist.world == 1:
            self.stop_requested = True

    def _write_status(self, status: str, **extra: Any) -> None:
        self.rundir.write_status(status, step=self.progress.step, total_steps=self.total_steps,
                                 world_size=self.dist.world, variant=run_variant(self.cfg), **extra)

    # ---- the loop ----------------------------------------------------------------------------------------------

    def fit(self, on_step: Callable[[Trainer], None] | None = None) -> dict[str, Any]:
        """Train to the end (resuming from the newest checkpoint if any). Returns a summary dict."""
        self.rundir.lock()
        try:
            return self._fit(on_step)
        finally:
            self.rundir.unlock()

    def _fit(self, on_step: Callable[[Trainer], None] | None) -> dict[str, Any]:
        self.resume()
        self.rundir.start(self.cfg)
        self._write_status("running")
        tracker = Tracker(self.run_dir, self.cfg.wandb, self.cfg.name, to_container(self.cfg),
                          active=self.dist.is_main, resume_step=self.progress.step)
        cfg, p = self.cfg.train, self.progress
        bar = tqdm(total=self.total_steps, initial=p.step, disable=not self.dist.is_main, desc=self.cfg.name,
                   unit="step", dynamic_ncols=True)
        status, bad_local, last_metrics = "finished", 0, last_logged(self.run_dir, p.step)
        try:
            while p.step < self.total_steps and not self.stop_requested:
                for views, labels, n_bad in self._loader(p.epoch):
                    bad_local += n_bad  # this rank's; summed over ranks when logged
                    p.batch += 1
                    if not views:
                        continue
                    t0 = time.perf_counter()
                    terms = self.train_step(views, labels)
                    p.step += 1
                    bar.update(1)
                    if p.step % cfg.log_every == 0 or p.step == self.total_steps:
                        last_metrics = self._log_step(tracker, terms, t0, bad_local, bar)
                    if p.step % cfg.ckpt_every == 0:
                        self.save(periodic=True)
                    if on_step is not None:
                        on_step(self)
                    if p.step >= self.total_steps or self.stop_requested:
                        break
                else:  # the epoch ran out
                    tracker.log({"epoch": p.epoch, **self.validate()}, p.step)
                    p.epoch, p.batch = p.epoch + 1, 0
                    self.save()
            if self.stop_requested and p.step < self.total_steps:
                status = "interrupted"
            else:
                val = self.validate()
                tracker.log({"epoch": p.epoch, **val}, p.step)
                last_metrics.update(val)
            self.save()
        except BaseException as err:
            self._write_status("failed" if isinstance(err, Exception) else "interrupted", error=str(err))
            raise
        finally:
            bar.close()
            tracker.finish()
        self._write_status(status)
        bad_images = int(all_reduce_sum(torch.tensor(bad_local, device=self.device)).item())
        return {"status": status, "step": p.step, "run_dir": str(self.run_dir), "bad_images": bad_images,
                **last_metrics}


def last_logged(run_dir: Path, step: int) -> dict[str, Any]:
    """The last metrics line logged at or before `step` with a loss (what a relaunch of a finished run reports)."""
    from vitsinks.train.tracking import read_metrics

    lines = [m for m in read_metrics(run_dir) if "loss" in m and m["step"] <= step]
    return {k: v for k, v in lines[-1].items() if k != "step"} if lines else {}
