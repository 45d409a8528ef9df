"""`diagnose(model, images)`: every sink field of every (image, block, head), from the model's own internals.

Each block runs its normal (fused) forward and is rebuilt beside it from `SinkAttention.internals`
(`Block.forward_explicit`), which yields A, v and the gate and checks the recomputation (`recompute_error`). For
ReLU and sigmoid attention `mass` is in raw (unnormalised) weight units (docs/fidelity.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext

import numpy as np
import torch
from torch import nn

from vitsinks.backbones import adapt
from vitsinks.diagnostics.fields import FIELDS, head_fields, qk_spectrum
from vitsinks.diagnostics.head_shape import (
    ATTENTION_FIELDS,
    attention_shape,
    head_update_norms,
    projection_input,
    update_shares,
)
from vitsinks.diagnostics.neurons import NeuronCollector
from vitsinks.diagnostics.persistence import massive_emergence
from vitsinks.diagnostics.residual import block_stats
from vitsinks.models.attention import AttnInternals
from vitsinks.models.common_mode import common_mode_terms_per_image
from vitsinks.models.kinds import KINDS
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

    Beside the fields of docs/fidelity.md: `prefix_mass` (attention on the first `num_prefix` tokens), the attention's
    shape (`head_shape.attention_shape`), the update's common-mode terms, heads' shares and mitigation fields
    (`update_fields`), the massive tokens' emergence (`persistence.massive_emergence`, (B, L)), the output stream's
    token norms (`token_norm_max`,
    `token_norm_median`, `massive_ratio`, `massive_token`), the residual side (`res_*`, docs/residual.md) and
    `recompute_error` (L,); with `keep_maps`, `attn_col_mean` (keep_maps, L, H, N) and `token_norms` (keep_maps, L,
    N) for the plots. With `neurons` (a `NeuronCollector` of the same blocks), the register neurons' activations are
    collected from the same forward pass.
    """
    blocks = list(blocks)
    per_block: dict[str, list[torch.Tensor]] = {k: [] for k in (*FIELDS, "prefix_mass", *ATTENTION_FIELDS)}
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
        fields = head_fields(it.attn, it.v, blk.attn.proj.weight, layerscale(blk), KINDS[blk.attn.attn_kind].signed)
        for k in FIELDS:
            per_block[k].append(fields[k])
        per_block["prefix_mass"].append(it.attn[..., :num_prefix].float().abs().sum(-1).mean(-1))  # |A|: signed
        for k, v in attention_shape(it.attn).items():
            per_block[k].append(v)
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
    result.update(massive_emergence(result["res_norm"]))
    if keep_maps:
        result["attn_col_mean"] = torch.stack(maps, 1).cpu().numpy()
        result["token_norms"] = result["res_norm"][:keep_maps].astype(np.float32)
    return result


def diagnosed_mitigations(blocks: list[Block]) -> list[type[BlockMitigation]]:
    """The registered mitigations whose fields a diagnosis of `blocks` holds (always diagnosed, or in some block)."""
    return [m for m in MITIGATIONS.values() if m.diagnostic_fields and
            (m.always_diagnosed or any(m.present(blk) for blk in blocks))]


def update_fields(blk: Block, x: torch.Tensor, it: AttnInternals,
                  mitigations: Iterable[type[BlockMitigation]]) -> dict[str, torch.Tensor]:
    """Per image (B,) of one block: the common-mode terms `cm_num` / `cm_den` of its attention update where it enters
    the residual stream (with what update-site mitigations add, `Block.entering`), the heads' shares of it
    (`head_shape.update_shares`: `update_share` per head, `head_util`), and each mitigation's fields (per
    head or per image; its `diagnostic_fields` fill values in a block without it)."""
    z = blk.norm1(x)
    with projection_input(blk.attn) as seen:
        o = blk.ls1(blk.attn.combine(it.attn @ it.v, it.gate))
    num, den = common_mode_terms_per_image(blk.entering(o, z))
    attn_energy = o.float().square().mean(dim=(1, 2))  # the attention's own update, before update-site modules
    norms = head_update_norms(seen[-1], blk.attn.proj.weight, blk.attn.num_heads, layerscale(blk))
    out = {"cm_num": num, "cm_den": den, **update_shares(norms)}
    for m in mitigations:
        got = m.diagnostics(blk, z, it, attn_energy)
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
    return {k: np.max(np.stack([p[k] for p in parts]), axis=0) if k == "recompute_error"
            else np.concatenate([p[k] for p in parts if k in p], axis=0) for k in parts[0]}


@torch.no_grad()
def diagnose_inputs(blocks: Iterable[Block], embed_fn: Callable[[torch.Tensor], torch.Tensor],
                    inputs: torch.Tensor, batch_size: int = 16, causal: bool = False, keep_maps: int = 0,
                    num_prefix: int = 1, neurons: NeuronCollector | None = None, chosen: Sequence[int] | None = None,
                    name: str = "the model") -> dict[str, np.ndarray]:
    """`diagnose_chosen` (default: every block) over `inputs` in batches (each embedded by `embed_fn`), joined along
    images; a recomputation that differs from `name`'s own forward by more than `RECOMPUTE_TOL` is refused."""
    blocks = list(blocks)
    chosen = list(range(len(blocks))) if chosen is None else list(chosen)
    parts = [diagnose_chosen(blocks, embed_fn(inputs[lo : lo + batch_size]), chosen, max(0, keep_maps - lo),
                             num_prefix, neurons, causal)
             for lo in range(0, len(inputs), batch_size)]
    out = concat_fields(parts)
    errors = out["recompute_error"]
    worst = int(np.argmax(errors))
    if errors[worst] > RECOMPUTE_TOL:
        raise CheckFailed(f"the explicit recomputation of block {chosen[worst]} differs from {name}'s own forward by "
                          f"{errors[worst]:.2e} (relative; tolerance {RECOMPUTE_TOL:.0e}): the diagnostics would "
                          f"describe another computation than the model's, nothing was written")
    return out


def chosen_blocks(n_blocks: int, blocks: Iterable[int] | None) -> list[int]:
    """Sorted distinct indices of `blocks` (negative: from the last; None: all); `BadValue` if none or outside."""
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
    out.update(massive_emergence(out["res_norm"]))  # over the chosen blocks together, not each alone
    return out


def diagnose_chosen(blocks: Sequence[Block], x: torch.Tensor, chosen: Sequence[int], keep_maps: int = 0,
                    num_prefix: int = 1, neurons: NeuronCollector | None = None,
                    causal: bool = False) -> dict[str, np.ndarray]:
    """`diagnose_tokens` of the `chosen` blocks only, each diagnosed alone on the stream the blocks before make."""
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
    """All diagnostics of a model (its `Backbone`, or a model of an adapted family) on `images` (n, 3, H, W),
    batched: arrays (images, blocks, heads), the key layout (`KeyLayout.fields`) and `grid` (patch rows, columns).
    `neurons`: a `NeuronCollector` of its blocks, filled on the way; `blocks`: only these (`diagnose_chosen`). A
    recomputation that differs from `name`'s own forward is refused (`CheckFailed`)."""
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
