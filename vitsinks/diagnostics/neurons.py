"""Register neurons (Jiang et al. 2025, "Vision Transformers Don't Need Trained Registers"; docs/trainfree.md): the
few MLP units whose activations put the high-norm artifacts on patch tokens.

The outlier tokens of an image are its PATCH tokens whose residual-stream norm at the output of the model's last
block exceeds `k` x the median norm of all its tokens at that block (`residual.high_norm`, the summary's test, at the
last block). The score of unit u of block b is, averaged over the images with at least one outlier token, the mean of
|a_u| over that image's outlier tokens, a_u being the unit's activation (the output of the MLP's activation module).
The units are ranked over all blocks together (`find_register_neurons`) or per block (`summarize_neurons`). A block
is read through `blk.mlp_parts()` (`models.mlp.MLPParts`: input layer, activation, output layer, LayerScale gain),
which every block of the seam gives (`vitsinks.models.seam.Block`: `SinkBlock` and every family's view); only a plain
MLP (in -> act -> out, no hidden-layer
norm) has register neurons here (`has_mlp`): in a gated MLP (GluMlp, SwiGLU) `act` is only the gate, and a
hidden-layer norm makes a unit's contribution non-linear.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from timm.layers import Mlp
from torch import nn

from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics.residual import check_ks, high_norm
from vitsinks.models.passes import block_outputs_by_batch
from vitsinks.models.seam import Backbone, Block
from vitsinks.models.vit import NoMLP
from vitsinks.utils.errors import BadValue


def neuron_k(ks: Sequence[float]) -> float:
    """The threshold the register-neuron ranking uses among `diagnostics.high_norm_k`: the lower middle value of
    the sorted list (5.0 of the default [2, 5, 10, 20]: 2 also catches ordinary spread, 20 misses milder artifacts)."""
    check_ks(ks)
    vals = sorted(float(k) for k in ks)
    if not vals:
        raise BadValue("diagnostics.high_norm_k is empty: give at least one multiple > 1 of the median token norm")
    return vals[(len(vals) - 1) // 2]


def has_mlp(blk: Block) -> bool:
    """Whether a block has units register neurons can be among: a plain MLP (`blk.mlp_parts()`; for a `SinkBlock`, a
    timm `Mlp`, exactly that class, without a hidden-layer norm). `NoMLP` (`model.mlp=false`) has no units; another
    MLP (GluMlp, SwiGLU, a hidden norm) is not supported (`unsupported_mlp`)."""
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
    """The direct part of `units` (K,) of the block's MLP update at tokens with hidden activations `acts` (n, H):
    gamma * W_out[:, units] a_units (n, D), gamma the MLP LayerScale gain (1 without); in float64. The output
    layer's bias is no unit's. Only for a block with `has_mlp` (nothing between the activation and the output)."""
    parts = blk.mlp_parts()
    assert parts is not None  # a block with `has_mlp`
    w = parts.fc_out.weight
    w2 = w.detach().double()[:, units.to(w.device)]  # (D, K)
    out = acts[:, units].double().to(w2.device) @ w2.T
    return out * parts.gamma.detach().double() if parts.gamma is not None else out


@dataclass
class OutlierActivations:
    """What `capture` keeps: per block (None without an MLP) the sum over images with an outlier token of the
    mean |activation| over their outlier tokens (H,), and at every outlier token (all images together) the
    activations (n, H) and the block's output (n, D); `images` counts the images with an outlier token."""

    score_sum: list[torch.Tensor | None]
    acts: list[list[torch.Tensor]] = field(default_factory=list)
    outs: list[list[torch.Tensor]] = field(default_factory=list)
    images: int = 0

    def scores(self, b: int) -> torch.Tensor | None:
        """The units' scores of block b (H,), None without an MLP or without any outlier token."""
        s = self.score_sum[b]
        return None if s is None or not self.images else s / self.images


def outlier_mask(norms: torch.Tensor, k: float, num_prefix: int) -> torch.Tensor:
    """(B, N) bool on the device of `norms`: the patch tokens (from `num_prefix` on) that `residual.high_norm` marks
    at threshold `k` (norm above k x the image's median token norm), `norms` (B, N) at the last block."""
    mask = torch.from_numpy(high_norm(norms.detach().float().cpu().numpy(), k, "the high-norm threshold k"))
    mask[:, :num_prefix] = False
    return mask.to(norms.device)


class NeuronCollector:
    """Collects `OutlierActivations` of `blocks` at threshold `k` batch by batch, beside a forward pass that is run
    anyway (the diagnosis's): inside `recording()` the blocks' MLP activations are kept (the first call of each
    block's MLP only: an explicit recomputation of the block does not overwrite them), and `add_batch(outs)` keeps
    those at the outlier tokens of the batch, `outs` being every block's output."""

    def __init__(self, blocks: Sequence[Block], k: float, num_prefix: int) -> None:
        (self.k,) = check_ks([k], "the high-norm threshold k")
        self.blocks, self.num_prefix = list(blocks), num_prefix
        n = len(self.blocks)
        self.got = OutlierActivations([None] * n, [[] for _ in range(n)], [[] for _ in range(n)])
        self._store: dict[int, torch.Tensor] = {}

    @staticmethod
    def activation(blk: Any) -> nn.Module | None:
        """The module whose output is a block's MLP activations (its units), None where it has none (`has_mlp`)."""
        parts = blk.mlp_parts()
        return None if parts is None else parts.act

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Keep each block's MLP activations of the batch that runs inside."""
        def keep(b: int) -> Any:
            return lambda _m, _i, out: self._store.setdefault(b, out)

        acts = [(b, self.activation(blk)) for b, blk in enumerate(self.blocks)]
        handles = [act.register_forward_hook(keep(b)) for b, act in acts if act is not None]
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
    """Run the model on `images` in batches and keep the MLP activations at the outlier tokens (`OutlierActivations`;
    `outlier_mask` with threshold `k`)."""
    collector = NeuronCollector(backbone.blocks, k, backbone.num_prefix)
    with collector.recording():
        for outs in block_outputs_by_batch(backbone, images, batch_size):
            collector.add_batch(outs)
    return collector.got


def find_register_neurons(model: Backbone, images: torch.Tensor, top: int, k: float, batch_size: int = 16,
                          max_block: int | None = None) -> list[tuple[int, int, float]]:
    """The `top` register neurons of a model (its `Backbone`) on `images` over all blocks (or blocks 0..`max_block`
    only), highest score first: (block, unit, score). `BadValue` when no image has an outlier token at threshold `k`
    (nothing to rank), and for a model without an MLP or with one `has_mlp` does not support."""
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
    """Mean over the outlier tokens of 1 - ||x_t - c(t)|| / ||x_t||, x_t the block's output at token t (`outs`,
    (n, D)) and c(t) the direct part of `units` of its MLP update (`mlp_update`); None without outlier tokens."""
    if not len(acts):
        return None
    x = outs.double()
    c = mlp_update(blk, units, acts).to(x.device)
    share = 1 - (x - c).norm(dim=-1) / x.norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
    return float(share.mean())


def summarize_neurons(model: Backbone, images: torch.Tensor | None, settings: DiagnosticsConfig | Any,
                      got: OutlierActivations | None = None) -> dict[str, Any]:
    """summary.json's `register_neurons`: per block the `register_neurons` top units of the block (their indices
    and scores, highest first) and their `norm_share`, at the threshold `neuron_k(high_norm_k)`, from `got` (what a
    `NeuronCollector` kept during the diagnosis) or else a pass of its own over `images`. A block without an MLP or
    with an unsupported one (`has_mlp`), or a model without any outlier token on the images, gets empty lists and a
    null share."""
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
