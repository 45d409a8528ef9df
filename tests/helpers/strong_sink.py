"""A ViT with a sink that leads by hundreds of nats (`cls_sink_vit`), and the float64 truth of an edit of its
attention measured at the final patches (`final_patch_relrms_with`, `hand_relrms`): the redirect's and the
interventions' tests hold their numbers against it."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch

from tests.helpers.tiny import tiny_vit


def hand_relrms(base: torch.Tensor, edited: torch.Tensor, sinks: list[int], num_prefix: int = 3) -> np.ndarray:
    """Per image, the rel. RMS change over the patch tokens with the sink token (when it is a patch) left out."""
    out = []
    for i, s in enumerate(sinks):
        keep = [j for j in range(num_prefix, base.shape[1]) if j != s]
        d, p = edited[i, keep] - base[i, keep], base[i, keep]
        out.append(float((d**2).sum(-1).mean().sqrt() / (p**2).sum(-1).mean().sqrt()))
    return np.array(out)


def cls_sink_vit() -> torch.nn.Module:
    """A 2-block ViT whose head 0:0 scores [CLS] G (1 - cos(z_0, z_j)) ~ hundreds of nats above patch j (z: the
    normed tokens entering block 0; [CLS]'s is the same for every image), up to a few % per query; head 0:1 as
    initialised."""
    torch.manual_seed(0)
    return plant_cls_sink(tiny_vit(num_heads=2).eval())


def plant_cls_sink(model: torch.nn.Module) -> torch.nn.Module:
    """`model` (a ViT of 32 px inputs, a qkv bias) with head 0:0 made the [CLS] sink of `cls_sink_vit`, in place (a
    random direction u of the head drawn from torch's global generator)."""
    attn, dim = model.blocks[0].attn, model.embed_dim
    hd = attn.head_dim
    u = torch.randn(hd)
    u /= u.norm()
    with torch.no_grad():
        z0 = model.blocks[0].norm1(model.embed_tokens(torch.zeros(1, 3, 32, 32)))[0, 0]
        w, b = attn.qkv.weight, attn.qkv.bias
        w[:hd] *= 0.05  # queries: mostly u / scale, a little of the token
        b[:hd] = u / attn.scale
        w[dim : dim + hd] = 400.0 * torch.outer(u, z0) / z0.dot(z0)
        b[dim : dim + hd] = 0.0
    return model


def final_patch_relrms_with(model: torch.nn.Module, x: torch.Tensor, block: int, head: int, sink: torch.Tensor,
                            dtype: torch.dtype,
                            redirect: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> np.ndarray:
    """Per image (a ViT, no registers): head `block:head`'s attention A replaced by `redirect(A, sink)`, the model
    run in `dtype` (a float64 copy for the truth); the final patches' rel. RMS change, the sink patch left out."""
    m = copy.deepcopy(model).to(dtype).eval()
    with torch.no_grad():
        t = m.embed_tokens(x.to(dtype))
        for blk in m.blocks[:block]:
            t = blk(t)
        blk = m.blocks[block]
        it = blk.attn.internals(blk.norm1(t))
        out = it.attn @ it.v
        out[:, head] = redirect(it.attn[:, head], sink) @ it.v[:, head]
        edited = blk.from_heads(t, out, it.gate)
        for later in m.blocks[block + 1 :]:
            edited = later(edited)
        base, edited = m.norm(m.blocks(m.embed_tokens(x.to(dtype)))), m.norm(edited)
    return hand_relrms(base.double(), edited.double(), sink.tolist(), num_prefix=m.num_prefix_tokens)


def rescaled(a: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """Softmax probabilities with column sink[b] zeroed, rows divided by their new sum: the redirect, exact in
    float64 at leads below ~700 nats."""
    out = a.clone()
    out[torch.arange(len(a)), :, sink] = 0.0
    return out / out.sum(-1, keepdim=True)
