"""Register neurons (Jiang et al. 2025; docs/trainfree.md#register-neurons): the few MLP units whose activations put
the high-norm artifacts on patch tokens, scored at the outlier patch tokens of the last block (`residual.high_norm`)
and ranked over all blocks (`find_register_neurons`) or per block (`summarize_neurons`). Only a plain MLP (in -> act
-> out, no hidden-layer norm, read through `blk.mlp_parts()`) has register neurons here (`has_mlp`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from timm.layers import Mlp

from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics.residual import check_ks, high_norm
from vitsinks.models.passes import block_outputs_by_batch
from vitsinks.models.seam import Backbone, Block
from vitsinks.models.vit import NoMLP
from vitsinks.utils.errors import BadValue


def neuron_k(ks: Sequence[float]) -> float:
    """The register-neuron threshold among `diagnostics.high_norm_k`: the lower middle value of the sorted list."""
    check_ks(ks)
    vals = sorted(float(k) for k in ks)
    if not vals:
        raise BadValue("diagnostics.high_norm_k is empty: give at least one multiple > 1 of the median token norm")
    return vals[(len(vals) - 1) // 2]


def has_mlp(blk: Block) -> bool:
    """Whether a block has a plain MLP (`blk.mlp_parts()`) whose units register neurons can be among."""
    return blk.mlp_parts() is not None


def unsupported_mlp(blk: Block) -> str | None:
    """The name of the block's MLP when it has one that `has_mlp` does not support, else None."""
    if has_mlp(blk) or blk.mlp is None or isinstance(blk.mlp, NoMLP):
        return None
    norm = getattr(blk.mlp, "norm", None)
    if type(blk.mlp) is Mlp and norm is not None:
        return f"Mlp with a hidden-layer norm ({type(norm).__name__})"
    return type(blk.mlp).__name__


def mlp_update(blk: Block, units: torch.Tensor, acts: torch.Tensor) -> torch.Tensor:
    """The direct part gamma * W_out[:, units] a_units (n, D) of `units` (K,) of a `has_mlp` block's MLP update at
    tokens with hidden activations `acts` (n, H), in float64 (no bias; gamma the MLP LayerScale gain, 1 without)."""
    parts = blk.mlp_parts()
    assert parts is not None  # a block with `has_mlp`
    w = parts.fc_out.weight
    w2 = w.detach().double()[:, units.to(w.device)]  # (D, K)
    out = acts[:, units].double().to(w2.device) @ w2.T
    return out * parts.gamma.detach().double() if parts.gamma is not None else out


@dataclass
class OutlierActivations:
    """What `capture` keeps per block: the outlier tokens' activation scores, activations and outputs."""

    score_sum: list[torch.Tensor | None]
    acts: list[list[torch.Tensor]] = field(default_factory=list)
    outs: list[list[torch.Tensor]] = field(default_factory=list)
    images: int = 0

    def scores(self, b: int) -> torch.Tensor | None:
        """The units' scores of block b (H,), None without an MLP or without any outlier token."""
        s = self.score_sum[b]
        return None if s is None or not self.images else s / self.images


def outlier_mask(norms: torch.Tensor, k: float, num_prefix: int) -> torch.Tensor:
    """(B, N) bool: the patch tokens (from `num_prefix` on) that `residual.high_norm` marks at `k` in `norms`."""
    mask = torch.from_numpy(high_norm(norms.detach().float().cpu().numpy(), k, "the high-norm threshold k"))
    mask[:, :num_prefix] = False
    return mask.to(norms.device)


class NeuronCollector:
    """Collects `OutlierActivations` of `blocks` at `k` beside a forward pass (`recording()`, `add_batch`)."""

    def __init__(self, blocks: Sequence[Block], k: float, num_prefix: int) -> None:
        (self.k,) = check_ks([k], "the high-norm threshold k")
        self.blocks, self.num_prefix = list(blocks), num_prefix
        n = len(self.blocks)
        self.got = OutlierActivations([None] * n, [[] for _ in range(n)], [[] for _ in range(n)])
        self._store: dict[int, torch.Tensor] = {}

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Keep each block's MLP activations of the batch that runs inside."""
        def keep(b: int) -> Any:
            return lambda _m, _i, out: self._store.setdefault(b, out)

        handles = [parts.act.register_forward_hook(keep(b)) for b, blk in enumerate(self.blocks)
                   if (parts := blk.mlp_parts()) is not None]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @torch.no_grad()
    def add_batch(self, outs: Sequence[torch.Tensor]) -> None:
        """Keep the activations recorded for this batch at its outlier tokens (`outlier_mask` of the last output)."""
        got, store = self.got, self._store
        mask = outlier_mask(outs[-1].float().norm(dim=-1), self.k, self.num_prefix)
        hit = mask.any(-1)
        got.images += int(hit.sum())
        for b in range(len(self.blocks)):
            got.outs[b].append(outs[b][mask].float().cpu())
            if b not in store:
                continue
            a = store[b].float()
            mean_abs = (a.abs() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1)  # (B, H)
            part = mean_abs[hit].sum(0).cpu()
            kept = got.score_sum[b]
            got.score_sum[b] = part if kept is None else kept + part
            got.acts[b].append(a[mask].cpu())
        store.clear()


@torch.no_grad()
def capture(backbone: Backbone, images: torch.Tensor, k: float, batch_size: int = 16) -> OutlierActivations:
    """`OutlierActivations` of the model's MLPs at the outlier tokens (threshold `k`) of `images`, in batches."""
    collector = NeuronCollector(backbone.blocks, k, backbone.num_prefix)
    with collector.recording():
        for outs in block_outputs_by_batch(backbone, images, batch_size):
            collector.add_batch(outs)
    return collector.got


def find_register_neurons(model: Backbone, images: torch.Tensor, top: int, k: float, batch_size: int = 16,
                          max_block: int | None = None) -> list[tuple[int, int, float]]:
    """The `top` register neurons (block, unit, score) over blocks 0..`max_block`; `BadValue` if none to rank."""
    if top < 1:
        raise BadValue(f"ask for at least one register neuron, got top={top}")
    depth = len(model.blocks)
    if max_block is not None and not 0 <= max_block < depth:
        raise BadValue(f"max_block={max_block} is not a block of this {depth}-block model: give 0..{depth - 1} "
                       f"(or None: every block)")
    bad = [(b, name) for b, blk in enumerate(model.blocks) if (name := unsupported_mlp(blk)) is not None]
    if bad:
        b, name = bad[0]
        raise BadValue(f"register neurons need a plain MLP (in -> activation -> out, no hidden-layer norm), but block "
                       f"{b} has {name}: this model cannot get a test-time register")
    if not any(has_mlp(blk) for blk in model.blocks):
        raise BadValue("the model has no MLP (model.mlp=false): there are no register neurons to rank")
    got = capture(model, images, k, batch_size)
    if not got.images:
        raise BadValue(f"none of the {len(images)} images has a high-norm patch token (norm > {k:g} x the median at "
                       f"the last block): the model has no artifact for register neurons to move; use more images "
                       f"(trainfree.fit_images) or another checkpoint")
    last = depth - 1 if max_block is None else max_block
    ranked = [(b, u, float(s)) for b in range(last + 1) if (sc := got.scores(b)) is not None
              for u, s in enumerate(sc.tolist())]
    ranked.sort(key=lambda r: -r[2])  # stable: ties keep (block, unit) order
    return ranked[:top]


def norm_share(blk: Block, units: torch.Tensor, acts: torch.Tensor, outs: torch.Tensor) -> float | None:
    """Mean over outlier tokens of 1 - ||x_t - c(t)|| / ||x_t|| (c: `mlp_update` of `units`); None without any."""
    if not len(acts):
        return None
    x = outs.double()
    c = mlp_update(blk, units, acts).to(x.device)
    share = 1 - (x - c).norm(dim=-1) / x.norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
    return float(share.mean())


def summarize_neurons(model: Backbone, images: torch.Tensor | None, settings: DiagnosticsConfig | Any,
                      got: OutlierActivations | None = None) -> dict[str, Any]:
    """summary.json's `register_neurons` (docs/trainfree.md) from `got` (a collector's) or a pass over `images`."""
    if got is None:
        if images is None:
            raise ValueError("summarize_neurons needs the images or what a NeuronCollector kept")
        got = capture(model, images, neuron_k(settings.high_norm_k))
    by_block: list[dict[str, Any]] = []
    for b, blk in enumerate(model.blocks):
        sc = got.scores(b)
        if sc is None:
            by_block.append({"units": [], "scores": [], "norm_share": None})
            continue
        vals, units = sc.topk(min(int(settings.register_neurons), sc.numel()))
        share = norm_share(blk, units, torch.cat(got.acts[b]), torch.cat(got.outs[b]))
        by_block.append({"units": units.tolist(), "scores": vals.tolist(), "norm_share": share})
    return {"by_block": by_block}
