"""The controlled broadcast task (`python -m vitsinks.synthetic task=broadcast_pathway`; task, model and arms:
docs/pathway.md#study-the-controlled-broadcast-task): 32 tokens x_i ~ N(0, I_64), each to output x_i + x_{j*} R with
j* = argmax_j <x_j, u>; two pre-norm `SinkBlock`s; arms attention only, + global pathway, + common-mode penalty."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from timm.layers import Mlp
from torch import nn
from tqdm import tqdm

from vitsinks.models import GlobalPathway, SinkBlock, common_mode_penalty
from vitsinks.utils.errors import BadValue
from vitsinks.utils.progress import hidden

# the reference's three arms (a toy model's, not exp variants)
ARMS = ("attention", "global", "global+pen")
DIM, LENGTH, STATE_DIM, DEPTH = 64, 32, 64, 2
TASK_SEED, TRAIN_SEED, EVAL_SEED = 2000, 1000, 5000  # offsets added to the seed
REFERENCE_RECIPE = {"n_seeds": 5, "steps": 30_000, "batch": 1024, "lr": 5e-4, "weight_decay": 1e-4,
                    "cm_penalty": 1.0, "eval_batches": 64, "eval_batch": 256}
REFERENCE = {"attention": {"mse": 0.140, "inflow": [0.89, 0.91], "d_mse_no_attention_layer2": 2.906},
             "global": {"mse": 0.140, "inflow": [0.10, 0.91], "d_mse_no_attention_layer2": 2.875,
                        "d_mse_no_pathway_layer2": 0.515},
             "global+pen": {"mse": 0.144, "inflow": [0.06, 0.06], "d_mse_no_attention_layer2": 0.004,
                            "d_mse_no_pathway_layer2": 1.644}}


def task_constants(seed: int, dim: int = DIM, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The seed's unit selector u and orthogonal rotation R, from a generator seeded 2000 + seed."""
    g = torch.Generator(device=device).manual_seed(TASK_SEED + seed)
    u = torch.randn(dim, generator=g, device=device)
    return u / u.norm(), torch.linalg.qr(torch.randn(dim, dim, generator=g, device=device)).Q


def sample_tokens(gen: torch.Generator, batch: int, length: int = LENGTH, dim: int = DIM) -> torch.Tensor:
    """A batch of i.i.d. N(0, 1) tokens (batch, length, dim) drawn from `gen`, on its device."""
    return torch.randn(batch, length, dim, generator=gen, device=gen.device)


def pathway_targets(x: torch.Tensor, u: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """y_i = x_i + x_{j*} R with j* = argmax_j <x_j, u>, for tokens x (B, L, d)."""
    src = (x @ u).argmax(-1)
    return x + (x[torch.arange(len(x), device=x.device), src] @ R)[:, None]


class PositionThenNorm(nn.Module):
    """LN(x + p): layer 1's pre-norm, with the learned position embedding p added to its input only."""

    def __init__(self, norm: nn.Module, length: int, dim: int) -> None:
        super().__init__()
        self.norm = norm
        self.pos = nn.Parameter(torch.randn(length, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.pos)


def _biased_mlp(**kwargs: Any) -> Mlp:
    """timm's MLP with biases (timm's `Block` ties them to the attention's `proj_bias`, off here)."""
    return Mlp(**{**kwargs, "bias": True})


class BroadcastToy(nn.Module):
    """The task's two-layer model; `attention_updates`: each layer's W_O A V of the last forward with grad."""

    blocks: Any  # an nn.ModuleList of `SinkBlock`s (block 0's norm1 a `PositionThenNorm`), read by name

    def __init__(self, pathway: bool, dim: int = DIM, length: int = LENGTH, state_dim: int = STATE_DIM) -> None:
        super().__init__()
        blocks = [SinkBlock(dim, 1, mlp_ratio=4.0, qkv_bias=False, proj_bias=False, norm_layer=nn.LayerNorm,
                            mlp_layer=_biased_mlp) for _ in range(DEPTH)]
        blocks[0].norm1 = PositionThenNorm(blocks[0].norm1, length, dim)
        self.blocks = nn.ModuleList(blocks)
        if pathway:
            for blk in self.blocks:
                blk.pathway = GlobalPathway(dim, state_dim=state_dim, gate="learned")
        self.attention_updates: list[torch.Tensor] = []
        for blk in self.blocks:  # ls1 (Identity: no LayerScale) receives exactly the attention update
            blk.ls1.register_forward_hook(self._record_update)

    def _record_update(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        if torch.is_grad_enabled():
            self.attention_updates.append(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.attention_updates = []
        for blk in self.blocks:
            x = blk(x)
        return x


def summed_penalty(model: BroadcastToy) -> torch.Tensor:
    """pen_1 + pen_2: `common_mode_penalty` of each layer's attention update of the last forward pass, summed."""
    if len(model.attention_updates) != len(model.blocks):
        raise RuntimeError("summed_penalty needs one forward pass with gradients first")
    return torch.stack([common_mode_penalty(o) for o in model.attention_updates]).sum()


def build_arm(arm: str, seed: int, device: str | torch.device = "cpu") -> BroadcastToy:
    """The arm's model at init, with the reference's initial parameters of seed `seed` (`reference_init_`)."""
    if arm not in ARMS:
        raise BadValue(f"unknown arm {arm!r}; choose one of {ARMS}")
    model = BroadcastToy(pathway=arm != "attention")
    reference_init_(model, seed)
    return model.to(device)


@torch.no_grad()
def reference_init_(model: BroadcastToy, seed: int) -> None:
    """Redraw every parameter of `model` (on the CPU) in the order the reference's toy draws its own modules after
    `torch.manual_seed(seed)` (then the pathways' weights trunc-normal std 0.02, the gate bias zero), so that
    `seed=k` starts from the reference's seed-k parameters, bit for bit."""
    torch.manual_seed(seed)
    dim = model.blocks[0].attn.proj.in_features
    for i, blk in enumerate(model.blocks):
        q, k, v, o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        blk.attn.qkv.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
        blk.attn.proj.weight.copy_(o.weight)
        if i == 0:
            blk.norm1.pos.copy_(torch.randn(blk.norm1.pos.shape) * 0.02)
        for lin in (blk.mlp.fc1, blk.mlp.fc2):
            fresh = nn.Linear(lin.in_features, lin.out_features)
            lin.weight.copy_(fresh.weight)
            lin.bias.copy_(fresh.bias)
    for blk in model.blocks:
        pw = getattr(blk, "pathway", None)
        if pw is None:
            continue
        state = pw.out.in_features
        pool, value, out, gate = (nn.Linear(dim, 1, bias=False), nn.Linear(dim, state, bias=False),
                                  nn.Linear(state, dim, bias=False), nn.Linear(dim, 1))
        for lin in (pool, value, out, gate):
            nn.init.trunc_normal_(lin.weight, std=0.02)
        pw.inp.weight.copy_(torch.cat([pool.weight, gate.weight, value.weight]))  # rows: w_P, gate, W_VG
        pw.out.weight.copy_(out.weight)
        pw.gamma_bias.zero_()


def training_loss(model: BroadcastToy, x: torch.Tensor, y: torch.Tensor, cm_penalty: float | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, task MSE) of one batch: the MSE, plus cm_penalty * (pen_1 + pen_2) unless cm_penalty is None."""
    mse = ((model(x) - y) ** 2).mean()
    return (mse if cm_penalty is None else mse + cm_penalty * summed_penalty(model)), mse


def train_arm(arm: str, seed: int, steps: int, batch: int, lr: float, weight_decay: float = 1e-4,
              cm_penalty: float = 1.0, device: str | torch.device = "cpu") -> tuple[BroadcastToy, list[float]]:
    """One arm trained (AdamW, constant lr) on fresh batches seeded 1000 + seed: (model, training MSE per step)."""
    model = build_arm(arm, seed, device)
    u, R = task_constants(seed, device=device)
    gen = torch.Generator(device=device).manual_seed(TRAIN_SEED + seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    curve = torch.empty(steps, device=device)  # copied into: a kept `mse.detach()` pins a whole buffer per step
    for step in range(steps):
        x = sample_tokens(gen, batch)
        loss, mse = training_loss(model, x, pathway_targets(x, u, R), cm_penalty if arm == "global+pen" else None)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        curve[step] = mse.detach()
    return model, curve.tolist()


@contextmanager
def without_pathway(block: SinkBlock) -> Iterator[SinkBlock]:
    """The block with its global pathway removed (restored on exit)."""
    pathway = block.pathway
    block.pathway = None  # type: ignore[assignment]  # nn.Module.__setattr__ is typed without None, which it takes
    try:
        yield block
    finally:
        block.pathway = pathway


def _inflow(attn: torch.Tensor) -> float:
    """max_s mean_i A_is, averaged over sequences (one head: attn (B, 1, N, N))."""
    return float(attn.mean(-2).amax(-1).mean())


@torch.no_grad()
def evaluate_batch(model: BroadcastToy, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """MSE, inflow per layer, and the MSE increase when layer 2 loses its attention update or its pathway."""
    first, second = model.blocks
    h1, it1 = first.forward_explicit(x)
    out, it2 = second.forward_explicit(h1)
    heads = it2.attn @ it2.v

    def err(pred: torch.Tensor) -> float:
        return float(((pred - y) ** 2).mean())

    mse = err(out)
    res = {"mse": mse, "inflow": [_inflow(it1.attn), _inflow(it2.attn)],
           "d_mse_no_attention_layer2": err(second.from_heads(h1, torch.zeros_like(heads), it2.gate)) - mse}
    if second.pathway is not None:
        with without_pathway(second):
            res["d_mse_no_pathway_layer2"] = err(second.from_heads(h1, heads, it2.gate)) - mse
    return res


def evaluate_arm(model: BroadcastToy, seed: int, n_batches: int = 64, batch: int = 256) -> dict[str, Any]:
    """`evaluate_batch` over `n_batches` batches seeded 5000 + seed (each followed by a skipped one)."""
    model.eval()
    device = next(model.parameters()).device
    u, R = task_constants(seed, device=device)
    gen = torch.Generator(device=device).manual_seed(EVAL_SEED + seed)
    rows = []
    for _ in range(n_batches):
        x = sample_tokens(gen, batch)
        sample_tokens(gen, batch)
        rows.append(evaluate_batch(model, x, pathway_targets(x, u, R)))
    return {k: np.mean([r[k] for r in rows], axis=0).tolist() for k in rows[0]}


def run_broadcast_pathway(steps: int = 1000, seed: int = 0, n_seeds: int = 3, batch: int = 256, lr: float = 1e-2,
                          cm_penalty: float = 1.0, device: str = "cpu", progress: bool = True) -> dict[str, Any]:
    """Every arm on seeds seed .. seed + n_seeds - 1, per seed and averaged (the reference's: `REFERENCE_RECIPE`)."""
    start = time.perf_counter()
    per_seed: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    jobs = [(s, arm) for s in range(seed, seed + n_seeds) for arm in ARMS]
    for s, arm in tqdm(jobs, desc="broadcast_pathway (seed x arm)", disable=hidden(not progress)):
        model, curve = train_arm(arm, s, steps, batch, lr=lr, cm_penalty=cm_penalty, device=device)
        per_seed[arm].append({"seed": s, "final_train_mse": curve[-1], **evaluate_arm(model, s)})
    return {"task": "broadcast_pathway", "seed": seed, "n_seeds": n_seeds, "steps": steps, "batch": batch, "lr": lr,
            "weight_decay": 1e-4, "cm_penalty": cm_penalty, "penalty": "lambda_B * (pen_1 + pen_2), summed",
            "device": device, "wall_seconds": time.perf_counter() - start,
            "arms": {arm: _mean(rows) for arm, rows in per_seed.items()}, "per_seed": per_seed,
            "reference": REFERENCE, "reference_recipe": REFERENCE_RECIPE,
            "expected": "attention only: a sink in layer 2 (inflow >= 0.8); + global + penalty: inflow <= 0.15 in "
                        "both layers at an MSE within 10% of attention only, and removing layer 2's pathway costs "
                        "more than removing its attention (the reference's pattern)"}


def _mean(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in [k for k in rows[0] if k != "seed"]:
        vals = np.array([r[k] for r in rows], dtype=float)
        out[k] = vals.mean(axis=0).tolist()
        out[f"{k}_std"] = vals.std(axis=0, ddof=1).tolist() if len(rows) > 1 else None
    return out
