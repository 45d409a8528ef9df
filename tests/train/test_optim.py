"""The optimizer: fused AdamW on CUDA only, and a checkpoint of one implementation resumed with the other."""

from __future__ import annotations

import copy

import torch

from tests.helpers.tiny import tiny_cfg
from vitsinks.train.optim import build_optimizer, fused_adamw, load_optimizer_state


def test_adamw_is_fused_on_cuda_only(runs) -> None:
    assert fused_adamw(torch.device("cuda", 0)) and not fused_adamw(torch.device("cpu"))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer, _ = build_optimizer(model, tiny_cfg(runs), 10, 20)  # on the CPU: not fused
    assert optimizer.param_groups and all(not g["fused"] for g in optimizer.param_groups)


def _steps(optimizer: torch.optim.Optimizer, p: torch.nn.Parameter, grads: list[float]) -> None:
    for g in grads:
        p.grad = torch.full_like(p, g)
        optimizer.step()


def test_a_state_of_the_other_implementation_loads_with_this_optimizers_own() -> None:
    # fused AdamW runs on the CPU too in this torch: it stands in for a GPU run's checkpoint
    p = torch.nn.Parameter(torch.linspace(-1, 1, 6))
    fused = torch.optim.AdamW([p], lr=0.1, fused=True)
    _steps(fused, p, [0.5, -0.2])
    saved, at = copy.deepcopy(fused.state_dict()), p.detach().clone()  # the live state moves on
    _steps(fused, p, [0.3, 0.1])

    q = torch.nn.Parameter(at.clone())
    plain = torch.optim.AdamW([q], lr=0.1)
    load_optimizer_state(plain, saved)
    assert not plain.param_groups[0]["fused"]  # its own flag: torch alone would take the saved one
    _steps(plain, q, [0.3, 0.1])
    torch.testing.assert_close(q.detach(), p.detach())  # the same two updates (rounding apart)

    torch_alone = torch.optim.AdamW([torch.nn.Parameter(at.clone())], lr=0.1)
    torch_alone.load_state_dict(saved)
    assert torch_alone.param_groups[0]["fused"]
