"""Three synthetic tasks whose right answer about sinks is known, so they check the diagnostics.

- `trigger` (Ran-Milo 2026): [BOS, c_1 .. c_{T-2}, TRIGGER], causal; the target is the mean content at the trigger
  and zero elsewhere. Softmax can only output zero by parking its attention on BOS (value 0): a sink; ReLU
  attention can attend to nothing.
- `nop` (conditional damping): [BOS, x_1 .. x_T], one head, the whole residual stream as target. Tokens aligned
  with a direction e (97%) must pass unchanged, the others receive the mean random content: the head routes the
  aligned tokens to BOS (value ~0), a NOP sink, and W_Q W_K^T grows a dominant direction. The control updates every
  token. No q/k/v/output biases, so "zero output" can only mean a zero value.
- `broadcast`: two layers; a flagged source token's content must be added to every position: a broadcast sink.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, cast

import numpy as np
import torch

from vitsinks.diagnostics import classify, diagnose_tokens, events, spectrum
from vitsinks.diagnostics.fields import qk_singular_values
from vitsinks.models import SinkBlock
from vitsinks.models.layout import KeyLayout
from vitsinks.sinktasks.model import Batch, SeqModel, train
from vitsinks.sinktasks.pathway_task import run_broadcast_pathway

CONTENT = 8  # content dimension of every task
# the trigger task's two designed cases (the module docstring), not a list of every kind
TRIGGER_KINDS: tuple[str, ...] = ("softmax", "relu")


def trigger_batch(gen: torch.Generator, batch: int = 128, length: int = 16) -> Batch:
    """Features: content (8), is_bos, is_trigger. Loss weight 0 on BOS (its output is unconstrained)."""
    x = torch.zeros(batch, length, CONTENT + 2)
    x[:, 1:-1, :CONTENT] = torch.randn(batch, length - 2, CONTENT, generator=gen)
    x[:, 0, CONTENT] = 1.0
    x[:, -1, CONTENT + 1] = 1.0
    y = torch.zeros(batch, length, CONTENT)
    y[:, -1] = x[:, 1:-1, :CONTENT].mean(1)
    w = torch.ones(batch, length)
    w[:, 0] = 0.0
    w[:, -1] = length - 2  # the trigger position carries as much weight as all the zeros
    return x, y, w


def nop_batch(gen: torch.Generator, batch: int = 128, length: int = 20, control: bool = False,
              aligned_frac: float = 0.97) -> Batch:
    """Features: content (8), is_bos; aligned tokens add 3e (e the first axis) to random content orthogonal to e.
    Target: aligned tokens unchanged, the others plus the mean random content (control: every token updated)."""
    n = length - 1
    aligned = torch.rand(batch, n, generator=gen) < aligned_frac
    content = torch.randn(batch, n, CONTENT, generator=gen)
    content[..., 0] = 3.0 * aligned
    x = torch.zeros(batch, length, CONTENT + 1)
    x[:, 1:, :CONTENT] = content
    x[:, 0, CONTENT] = 1.0
    update = content.mean(1, keepdim=True).expand_as(content).clone()
    update[..., 0] = 0.0  # the update is the mean of the random part: nothing constant a value could cancel
    keep = torch.zeros_like(aligned) if control else aligned
    y = x.clone()  # the whole residual stream is the target (the BOS flag stays)
    y[:, 1:, :CONTENT] += torch.where(keep[..., None], 0.0, update)
    w = torch.ones(batch, length)
    w[:, 0] = 0.0
    return x, y, w


def broadcast_batch(gen: torch.Generator, batch: int = 128, length: int = 16) -> Batch:
    """Features: content (8), is_source. Target: every token plus the source's content."""
    x = torch.zeros(batch, length, CONTENT + 1)
    x[..., :CONTENT] = torch.randn(batch, length, CONTENT, generator=gen)
    src = torch.randint(0, length, (batch,), generator=gen)
    x[torch.arange(batch), src, CONTENT] = 1.0
    payload = x[torch.arange(batch), src, :CONTENT]
    y = x[..., :CONTENT] + payload[:, None]
    return x, y, torch.ones(batch, length)


def _diagnose(model: SeqModel, x: torch.Tensor) -> dict[str, np.ndarray]:
    blocks = cast("list[SinkBlock]", list(model.blocks))  # a `SeqModel`'s
    with torch.no_grad():
        d = diagnose_tokens(blocks, model.embed(x), causal=model.causal)
    # a sequence: no registers
    return {**d, **spectrum(blocks), **KeyLayout(0, x.shape[1] - 1, blocks[0].attn.extra_keys).fields()}


def _attention(model: SeqModel, x: torch.Tensor) -> list[torch.Tensor]:
    """Explicit attention of every block along the model's forward, (B, H, N, K) each (any extra key slot last)."""
    maps, h = [], model.embed(x)
    with torch.no_grad():
        for blk in cast("Iterable[SinkBlock]", model.blocks):  # a `SeqModel`'s
            h, it = blk.forward_explicit(h, causal=model.causal)
            maps.append(it.attn)
    return maps


def _rel_error(model: SeqModel, batch_fn: Callable[[torch.Generator], Batch], seed: int = 123) -> float:
    """Test error relative to the target's energy, on fresh sequences."""
    x, y, w = batch_fn(torch.Generator().manual_seed(seed))
    with torch.no_grad():
        y = model.embed_target(y)
        err = (((model(x) - y) ** 2).sum(-1) * w).sum() / ((y**2).sum(-1) * w).sum().clamp_min(1e-12)
    return float(err)


def _round(a: torch.Tensor | np.ndarray) -> list:
    return np.round(np.asarray(a, dtype=np.float64), 4).tolist()


def run_trigger(steps: int = 1500, seed: int = 0) -> dict[str, Any]:
    """Softmax vs ReLU attention, one head and four heads, on the trigger task."""
    results: dict[str, Any] = {}
    for heads in (1, 4):
        for attn in TRIGGER_KINDS:
            torch.manual_seed(seed)
            model = SeqModel(CONTENT + 2, CONTENT, dim=32, heads=heads, attn=attn, causal=True)
            curve = train(model, trigger_batch, steps, seed=seed)
            x, _, _ = trigger_batch(torch.Generator().manual_seed(7), batch=64)
            a = _attention(model, x)[0]
            bos = a[:, :, 1:-1, 0]  # content (non-trigger, non-BOS) queries -> BOS key; (B, H, T-2)
            results[f"{attn}_{heads}h"] = {
                "attn": attn, "heads": heads, "final_loss": curve[-1],
                "task_rel_error": _rel_error(model, trigger_batch),
                "bos_attention_nontrigger": float(bos.mean()),
                "bos_attention_nontrigger_max_head": float(bos.mean(dim=(0, 2)).max()),
                "attention_mean": _round(a.mean(dim=(0, 1))),
            }
    return {"task": "trigger", "seed": seed, "steps": steps, "models": results,
            "expected": "softmax: BOS attention >= 0.9 (max over heads); relu: <= 0.05; similar task error"}


def train_nop(steps: int = 1500, seed: int = 0, control: bool = False) -> tuple[SeqModel, list[float]]:
    """The NOP task's one-head model (or its control), trained; returns (model, loss curve)."""
    torch.manual_seed(seed)
    model = SeqModel(CONTENT + 1, None, heads=1)
    return model, train(model, partial(nop_batch, control=control), steps, seed=seed)


def train_broadcast(steps: int = 1500, seed: int = 0) -> tuple[SeqModel, list[float]]:
    """The broadcast task's two-layer, two-head model, trained; returns (model, loss curve)."""
    torch.manual_seed(seed)
    model = SeqModel(CONTENT + 1, CONTENT, dim=32, depth=2, heads=2)
    return model, train(model, broadcast_batch, steps, seed=seed)


def run_nop(steps: int = 1500, seed: int = 0) -> dict[str, Any]:
    """The damping model vs its control: where the sink sits, its class, and the QK spectrum."""
    out: dict[str, Any] = {"task": "nop", "seed": seed, "steps": steps, "models": {}}
    for name, control in (("damping", False), ("control", True)):
        model, curve = train_nop(steps, seed, control)
        batch = partial(nop_batch, control=control)
        x, _, _ = batch(torch.Generator().manual_seed(7))
        d = _diagnose(model, x)
        ev, cls = events(d), classify(d)
        attn = cast(SinkBlock, model.blocks[0]).attn
        out["models"][name] = {
            "final_loss": curve[-1], "task_rel_error": _rel_error(model, batch),
            "sink_event_rate": float(ev.mean()), "sink_on_bos_rate": float((ev & (d["sink_idx"] == 0)).mean()),
            "nop_rate": float((ev & (cls == 0)).mean()), "mass": float(d["mass"].mean()),
            "ratio_out": float(np.median(d["ratio_out"])), "routed_frac": float(d["routed_frac"].mean()),
            "qk_sigma1_frac": float(d["qk_sigma1_frac"].max()),
            "qk_sigma1_over_sigma2": float(d["qk_sigma1_over_sigma2"].max()),
            "qk_singular_values": _round(qk_singular_values(attn.qkv.weight, attn.num_heads)[0]),
            "attention_example": _round(_attention(model, x[:1])[0][0, 0]),
        }
    out["expected"] = ("damping: sink on BOS, NOP-like (ratio_out <= 0.2), larger sigma1 share than the control; "
                       "control: no sink")
    return out


def run_broadcast(steps: int = 1500, seed: int = 0) -> dict[str, Any]:
    """Two layers: find the hub head and classify it."""
    model, curve = train_broadcast(steps, seed)
    x, _, _ = broadcast_batch(torch.Generator().manual_seed(7))
    src = x[..., CONTENT].argmax(-1).numpy()
    d = _diagnose(model, x)
    ev, cls = events(d), classify(d)
    hub = np.unravel_index(np.argmax(ev.mean(0)), ev.shape[1:])  # the (block, head) most often a sink
    on_source = d["sink_idx"][:, hub[0], hub[1]] == src
    return {
        "task": "broadcast", "seed": seed, "steps": steps, "final_loss": curve[-1],
        "task_rel_error": _rel_error(model, broadcast_batch), "hub_block": int(hub[0]), "hub_head": int(hub[1]),
        "hub_event_rate": float(ev[:, hub[0], hub[1]].mean()), "hub_on_source_rate": float(on_source.mean()),
        "hub_broadcast_rate": float((ev & (cls == 1))[:, hub[0], hub[1]].mean()),
        "hub_ratio_out": float(np.median(d["ratio_out"][:, hub[0], hub[1]])),
        "hub_stable_rank": float(np.median(d["stable_rank"][:, hub[0], hub[1]])),
        "source_example": int(src[0]),
        "attention_example": [_round(a[0]) for a in _attention(model, x[:1])],  # per block: (H, N, N)
        "expected": "the hub sinks on the source token and is broadcast-like (ratio >= 0.5, stable rank <= 1.5)",
    }


TASKS = {"trigger": run_trigger, "nop": run_nop, "broadcast": run_broadcast, "broadcast_pathway": run_broadcast_pathway}
