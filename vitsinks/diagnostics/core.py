"""`diagnose(model, images)`: every sink field of every (image, block, head), from the model's own internals.

The blocks run their normal (fused) forward to move the residual stream on; next to it each block is rebuilt
from `SinkAttention.internals` (`Block.forward_explicit`), which both yields A, v and the gate and checks
that the explicit computation reproduces the model (`recompute_error`). Only one block's attention matrices
are alive at a time.

For softmax-family attention `mass` is the share of each query's attention on the sink (rows sum to 1, or to
less than 1 with a sink logit). ReLU and sigmoid attention rows are not normalised: there `mass` is the mean
raw weight on the dominant key, comparable across heads of one model but not a probability, and the 0.5 / 0.9
sink thresholds are in those raw units.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext

import numpy as np
import torch
from torch import nn

from vitsinks.backbones import adapt
from vitsinks.diagnostics.fields import FIELDS, head_fields, qk_spectrum
from vitsinks.diagnostics.neurons import NeuronCollector
from vitsinks.diagnostics.residual import block_stats
from vitsinks.models.attention import AttnInternals
from vitsinks.models.common_mode import common_mode_terms_per_image
from vitsinks.models.mitigations import MITIGATIONS, BlockMitigation
from vitsinks.models.passes import eval_mode
from vitsinks.models.seam import Backbone, Block
from vitsinks.utils.errors import BadValue, CheckFailed, NonFinite

RECOMPUTE_TOL = 1e-4  # largest relative difference (fp32) between the explicit recomputation and the model


def layerscale(block: Block) -> torch.Tensor | None:
    """The block's attention LayerScale gamma (dim,), or None without LayerScale."""
    return getattr(block.ls1, "gamma", None)


@torch.no_grad()
def diagnose_tokens(blocks: Iterable[Block], x: torch.Tensor, causal: bool = False,
                    keep_maps: int = 0, num_prefix: int = 1,
                    neurons: NeuronCollector | None = None) -> dict[str, np.ndarray]:
    """Fields for token inputs `x` (B, N, dim) run through `blocks`; arrays are (B, L, H) unless noted.

    Beside the fields of docs/fidelity.md: `prefix_mass`, the mean over queries of the attention on the first
    `num_prefix`
    tokens ([CLS] and registers: a sink split over several registers shows here, not in `mass`), and
    `gate_mean`, the head's mean gate value over tokens (NaN without a gate).

    Also (B, L): the common-mode terms of each block's attention update and the global pathway's fields (see
    `update_fields`); `token_norm_max`, `token_norm_median`, `massive_ratio`, `massive_token` of each block's output
    residual stream; `recompute_error` (L,); with `keep_maps`, `attn_col_mean` (keep_maps, L, H, N), the mean
    attention each key receives, for the attention-map plots, and `token_norms` (keep_maps, L, N), the norm of every
    token of each block's output.

    The residual side (docs/residual.md, `residual.block_stats` of each block's output): `res_norm` (B, L, N) every
    token's norm, `res_top` (B, L, TOP) the largest |h| over tokens x channels, `res_abs_median` (B, L) the median
    |h|, `res_top_channel` / `res_top_token` (B, L) where the largest sits; `res_norm_in` (B, N) every token's norm
    entering block 0 (what block 0's attention sees, as block b - 1's output is what block b's sees).

    With `neurons` (a `NeuronCollector` of the same blocks), the register neurons' activations are collected from
    the same forward pass.
    """
    blocks = list(blocks)
    per_block: dict[str, list[torch.Tensor]] = {k: [] for k in (*FIELDS, "prefix_mass")}
    norms_max, norms_med, norms_arg, maps = [], [], [], []
    errors: list[float] = []  # per block
    res: dict[str, list[torch.Tensor]] = {}
    update: dict[str, list[torch.Tensor]] = {}
    mitigations = diagnosed_mitigations(blocks)
    outs: list[torch.Tensor] = []
    norm_in = x.float().norm(dim=-1)
    for blk in blocks:
        with neurons.recording() if neurons is not None else nullcontext():
            ref = blk(x, is_causal=True) if causal else blk(x)
        if not bool(torch.isfinite(ref).all()):
            raise NonFinite(f"the model's activations are not finite (NaN or inf) after block {len(errors)}: "
                            f"its weights or inputs are broken; diagnose a checkpoint of a run that did not diverge")
        out, it = blk.forward_explicit(x, causal=causal)
        errors.append(((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item())
        for k, v in update_fields(blk, x, it, mitigations).items():
            update.setdefault(k, []).append(v)
        fields = head_fields(it.attn, it.v, blk.attn.proj.weight, layerscale(blk))
        for k in FIELDS:
            per_block[k].append(fields[k])
        per_block["prefix_mass"].append(it.attn[..., :num_prefix].float().sum(-1).mean(-1))
        if keep_maps:
            maps.append(it.attn[:keep_maps].float().mean(-2))
        del it, out
        x = ref
        if neurons is not None:
            outs.append(ref)
        stats = block_stats(x)
        for k, v in stats.items():
            res.setdefault(f"res_{k}", []).append(v)
        norms = stats["norm"]  # (B, N)
        norms_max.append(norms.amax(-1))
        norms_med.append(norms.median(-1).values)
        norms_arg.append(norms.argmax(-1))
    if neurons is not None:
        neurons.add_batch(outs)
    result = {k: torch.stack(v, dim=1).cpu().numpy() for k, v in {**per_block, **update, **res}.items()}
    tmax, tmed = torch.stack(norms_max, 1), torch.stack(norms_med, 1)
    result.update(
        token_norm_max=tmax.cpu().numpy(), token_norm_median=tmed.cpu().numpy(),
        massive_ratio=(tmax / tmed.clamp_min(1e-12)).cpu().numpy(),
        massive_token=torch.stack(norms_arg, 1).cpu().numpy(), recompute_error=np.array(errors),
        res_norm_in=norm_in.cpu().numpy(),
    )
    if keep_maps:
        result["attn_col_mean"] = torch.stack(maps, 1).cpu().numpy()
        result["token_norms"] = result["res_norm"][:keep_maps].astype(np.float32)
    return result


def diagnosed_mitigations(blocks: Iterable[Block]) -> list[type[BlockMitigation]]:
    """The registered mitigations whose fields a diagnosis of `blocks` holds: those diagnosed always, and the others
    where some block has them."""
    blocks = list(blocks)
    return [m for m in MITIGATIONS.values() if m.diagnostic_fields and
            (m.always_diagnosed or any(m.present(blk) for blk in blocks))]


def update_fields(blk: Block, x: torch.Tensor, it: AttnInternals,
                  mitigations: Iterable[type[BlockMitigation]]) -> dict[str, torch.Tensor]:
    """Per image (B,) of one block: `cm_num` / `cm_den`, the common-mode terms of the attention update
    o = ls1 * attn(z) (`models.common_mode`); and each mitigation's fields (per head (B, heads) at the heads,
    per image (B,) at the update), its `diagnostic_fields` fill values in a block without it."""
    o = blk.ls1(blk.attn.combine(it.attn @ it.v, it.gate))
    num, den = common_mode_terms_per_image(o)
    out = {"cm_num": num, "cm_den": den}
    z = blk.norm1(x)
    for m in mitigations:
        got = m.diagnostics(blk, z, it, den)
        if got is None:
            shape = it.attn.shape[:2] if m.site != "update" else den.shape  # on the attention: per head
            got = {k: torch.full(shape, fill, device=den.device) for k, fill in m.diagnostic_fields.items()}
        out.update(got)
    return out


def spectrum(blocks: Iterable[Block]) -> dict[str, np.ndarray]:
    """Per (block, head) query-key spectrum of Theta: `qk_sigma1_frac` and `qk_sigma1_over_sigma2`, (L, H)."""
    frac, gap = zip(*(qk_spectrum(b.attn.qkv.weight, b.attn.num_heads) for b in blocks), strict=True)
    return {"qk_sigma1_frac": torch.stack(frac).numpy(), "qk_sigma1_over_sigma2": torch.stack(gap).numpy()}


def concat_fields(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Join per-batch `diagnose_tokens` results along images (the recomputation error: its maximum)."""
    out = {}
    for k in parts[0]:
        if k == "recompute_error":
            out[k] = np.max(np.stack([p[k] for p in parts]), axis=0)
        else:
            out[k] = np.concatenate([p[k] for p in parts if k in p], axis=0)
    return out


@torch.no_grad()
def diagnose_inputs(blocks: Iterable[Block], embed_fn: Callable[[torch.Tensor], torch.Tensor],
                    inputs: torch.Tensor, batch_size: int = 16, causal: bool = False, keep_maps: int = 0,
                    num_prefix: int = 1, neurons: NeuronCollector | None = None, chosen: Sequence[int] | None = None,
                    name: str = "the model") -> dict[str, np.ndarray]:
    """`diagnose_chosen` (default: every block) over `inputs` in batches (each embedded by `embed_fn`), joined along
    images; a recomputation that differs from `name`'s own forward is refused (`check_recomputation`)."""
    blocks = list(blocks)
    chosen = list(range(len(blocks))) if chosen is None else list(chosen)
    parts = [diagnose_chosen(blocks, embed_fn(inputs[lo : lo + batch_size]), chosen, max(0, keep_maps - lo),
                             num_prefix, neurons, causal)
             for lo in range(0, len(inputs), batch_size)]
    out = concat_fields(parts)
    check_recomputation(out["recompute_error"], chosen, name,
                        "the diagnostics would describe another computation than the model's, nothing was written")
    return out


def check_recomputation(errors: np.ndarray, blocks: Sequence[int], model: str, consequence: str) -> None:
    """Refuse a diagnosis whose explicit recomputation of some block (`errors` per block, `blocks` their indices)
    differs from `model`'s own forward by more than `RECOMPUTE_TOL`; `consequence` says what that means."""
    worst = int(np.argmax(errors))
    if errors[worst] > RECOMPUTE_TOL:
        raise CheckFailed(f"the explicit recomputation of block {blocks[worst]} differs from {model}'s own forward by "
                          f"{errors[worst]:.2e} (relative; tolerance {RECOMPUTE_TOL:.0e}): {consequence}")


def chosen_blocks(n_blocks: int, blocks: Iterable[int] | None) -> list[int]:
    """Sorted distinct block indices of `blocks` (negative ones from the last; None: every block); a `BadValue`
    for an index outside the model or an empty choice."""
    asked = list(range(n_blocks)) if blocks is None else [int(b) for b in blocks]
    wrong = [b for b in asked if not -n_blocks <= b < n_blocks]
    if wrong or not asked:
        raise BadValue(f"blocks {wrong or '[]'}: choose some of the model's {n_blocks} blocks (0..{n_blocks - 1}, "
                       f"or negative from the last)")
    return sorted({b % n_blocks for b in asked})


def _join_blocks(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """`diagnose_tokens` results of single blocks joined along the block axis (the input norms: the first's)."""
    out = {"recompute_error": np.concatenate([p["recompute_error"] for p in parts]),
           "res_norm_in": parts[0]["res_norm_in"]}
    for k in parts[0]:
        if k not in out:
            out[k] = np.concatenate([p[k] for p in parts], axis=1)
    return out


def diagnose_chosen(blocks: Sequence[Block], x: torch.Tensor, chosen: Sequence[int], keep_maps: int = 0,
                    num_prefix: int = 1, neurons: NeuronCollector | None = None,
                    causal: bool = False) -> dict[str, np.ndarray]:
    """`diagnose_tokens` of the `chosen` blocks only: every block up to the last chosen runs its real forward (the
    stream stays right), each chosen one is diagnosed alone (its real forward a second time)."""
    if list(chosen) == list(range(len(blocks))):
        return diagnose_tokens(blocks, x, causal, keep_maps, num_prefix, neurons)
    if neurons is not None or causal:
        raise BadValue("the register neurons and causal models are diagnosed over every block: choose all blocks "
                       "(blocks=None)")
    parts = []
    for b in range(chosen[-1] + 1):
        if b in chosen:
            parts.append(diagnose_tokens([blocks[b]], x, keep_maps=keep_maps, num_prefix=num_prefix))
        x = blocks[b](x)
    return _join_blocks(parts)


@torch.no_grad()
def diagnose(model: Backbone | nn.Module, images: torch.Tensor, batch_size: int = 16, keep_maps: int = 4,
             neurons: NeuronCollector | None = None, blocks: Iterable[int] | None = None,
             name: str = "the model") -> dict[str, np.ndarray]:
    """All diagnostics of a model (its `Backbone`, or a model of an adapted family: vitsinks' own ViT, a timm,
    transformers or open_clip one, `vitsinks.backbones.adapt`) on `images` (n, 3, H, W), batched; arrays shaped
    (images, blocks, heads); with `neurons` (a `NeuronCollector` of the backbone's blocks) the
    register neurons are collected on the way. `blocks`: diagnose only these (see `diagnose_chosen`; the arrays'
    block axis then follows them).

    Adds the key layout (`KeyLayout.fields`: `num_prefix`, `num_registers`, `num_patches`, `extra_keys`) so the
    sink location ([CLS], register, patch, an extra key slot) can be read from `sink_idx`, and `grid` (patch rows,
    columns) for the attention maps. A recomputation that differs from `name`'s own forward is refused
    (`check_recomputation`).
    """
    backbone = adapt(model)
    chosen = chosen_blocks(len(backbone.blocks), blocks)
    with eval_mode(backbone) as device:
        result = diagnose_inputs(backbone.blocks, lambda batch: backbone.embed_tokens(batch.to(device)), images,
                                 batch_size, keep_maps=keep_maps, num_prefix=backbone.num_prefix, neurons=neurons,
                                 chosen=chosen, name=name)
    result.update(spectrum(backbone.blocks[b] for b in chosen))
    img_size = (int(images.shape[-2]), int(images.shape[-1]))
    result.update(backbone.key_layout(img_size).fields())
    result["grid"] = np.array(backbone.grid(img_size))
    return result
