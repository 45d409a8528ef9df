"""torch.distributed set-up from torchrun or SLURM variables (NCCL on GPU, gloo on CPU)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn as dist_nn
from torch import nn

# How long a collective waits for the slowest rank before it fails: long enough for rank 0 to write a checkpoint and
# its diagnostics while the others wait (NCCL's own default is 10 minutes)
PG_TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: global rank, world size, rank on its node, device."""

    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _export_slurm_env() -> None:
    """Fill torchrun-style variables from SLURM's (via submitit), when launched by srun without torchrun."""
    if "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    from submitit.helpers import TorchDistributedEnvironment

    TorchDistributedEnvironment().export()


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """The device `cluster.device` names for this process: `auto` is this rank's GPU when CUDA is available, else the
    CPU. This rank's GPU is `local_rank` (default: LOCAL_RANK) modulo the visible GPUs, so one GPU per task (SLURM's
    GPU binding) gives every rank device 0."""
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("cluster.device=cuda but CUDA is not available: use cluster.device=auto or cpu")
        index = local_rank % max(1, torch.cuda.device_count())
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(name)


def init_distributed(device: str = "auto") -> DistInfo:
    """Initialise the process group if WORLD_SIZE (torchrun) or SLURM_NTASKS (srun) says there are several ranks:
    NCCL bound to this rank's GPU (`device_id`), else gloo; collectives time out after `PG_TIMEOUT`."""
    _export_slurm_env()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if world > 1 and not dist.is_initialized():
        bound: dict[str, Any] = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world,
                                timeout=PG_TIMEOUT, **bound)
    return DistInfo(rank, world, local_rank, dev)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_world() -> tuple[int, int]:
    """(this process's rank, number of ranks): (0, 1) outside a process group."""
    return (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order, on every rank (a collective); `[obj]` outside a process group."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (identity in one process); not differentiable."""
    if is_distributed():
        x = x.clone()
        dist.all_reduce(x)
    return x


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum over ranks (identity in one process); not differentiable."""
    if is_distributed():
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def differentiable_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks whose backward sums the gradients over ranks (the gradient of the global objective)."""
    with warnings.catch_warnings():  # deprecated in favour of a private API; lightly's SIGReg uses it too
        warnings.simplefilter("ignore", FutureWarning)
        return dist_nn.all_reduce(x)


class AllReduceBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d with statistics over the global batch on any backend (torch's SyncBatchNorm is GPU-only)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and is_distributed()):
            return super().forward(x)
        n = all_reduce_sum(torch.tensor(float(x.shape[0]), device=x.device))
        mean = differentiable_sum(x.sum(0)) / n
        var = differentiable_sum((x - mean).square().sum(0)) / n
        # running statistics and a momentum: the BatchNorm1d of a projection head, built with its defaults
        assert self.num_batches_tracked is not None and self.running_mean is not None
        assert self.running_var is not None and self.momentum is not None
        with torch.no_grad():
            self.num_batches_tracked += 1
            self.running_mean.lerp_(mean.detach(), self.momentum)
            self.running_var.lerp_(var.detach() * n / (n - 1), self.momentum)
        y = (x - mean) / torch.sqrt(var + self.eps)
        return y * self.weight + self.bias if self.affine else y


def sync_batchnorm(module: nn.Module, device: torch.device) -> nn.Module:
    """Make every BatchNorm1d of `module` use global-batch statistics under DDP."""
    if not is_distributed():
        return module
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    for name, child in module.named_children():
        if type(child) is nn.BatchNorm1d:
            new = AllReduceBatchNorm1d(child.num_features, child.eps, child.momentum, child.affine,
                                       child.track_running_stats)
            new.load_state_dict(child.state_dict())
            setattr(module, name, new)
        else:
            sync_batchnorm(child, device)
    return module


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
