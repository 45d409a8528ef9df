"""A pretrained model's views checked twice: against vitsinks' own ViT on the same weights converted, and against
its attention written out in float64 from the parameters; and the change an edit makes to the final patches, measured
through the library's own forward."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from vitsinks.diagnostics.core import diagnose_tokens
from vitsinks.diagnostics.fields import FIELDS
from vitsinks.models import SinkViT
from vitsinks.models.seam import Backbone

COMPARED = (*FIELDS[1:], "prefix_mass", "cm_num", "cm_den", "token_norm_max", "massive_ratio")


def assert_fields_equal_own(foreign: Backbone, own: SinkViT, x: torch.Tensor) -> None:
    """The views' tokens entering block 0 and every diagnostics field of `x` equal vitsinks' own ViT on the same
    weights converted (`own`): sink indices exactly, the rest (`COMPARED`, and every per-head field of `own`'s, a
    mitigation's such as `gate_mean` included) to 1e-4; the views rebuild every block within the recomputation
    tolerance."""
    t_foreign, t_own = foreign.embed(x), own.embed_tokens(x)
    torch.testing.assert_close(t_foreign, t_own, rtol=1e-6, atol=1e-6)
    got = diagnose_tokens(foreign.blocks, t_foreign, num_prefix=foreign.num_prefix)
    want = diagnose_tokens(own.blocks, t_own, num_prefix=own.num_prefix_tokens)
    assert got["recompute_error"].max() < 1e-4
    np.testing.assert_array_equal(got["sink_idx"], want["sink_idx"])
    per_head = [k for k, v in want.items() if v.shape == want["sink_idx"].shape and k not in (*COMPARED, "sink_idx")]
    for k in (*COMPARED, *per_head):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4, err_msg=k)


def assert_fields_match_attention(d: dict[str, np.ndarray], ref: torch.Tensor, num_prefix: int, block: int = 0) -> None:
    """Block `block` of the diagnostics `d` (`diagnose_tokens`) against the fields written out in float64 from a
    reference attention `ref` (B, H, N, N): the sink s = argmax_j mean_i A_ij exactly; its mass (mean_i A_is), the
    fraction of queries with A_is >= 0.5, min_i A_is and the mass on the prefix tokens to 1e-4."""
    ref = ref.double()
    col = ref.mean(-2)  # (B, H, N): mean attention each key receives
    s = col.argmax(-1)
    a_s = ref.gather(-1, s[..., None, None].expand(*ref.shape[:-1], 1)).squeeze(-1)  # (B, H, N): A_is over queries
    np.testing.assert_array_equal(d["sink_idx"][:, block], s.numpy())
    want = {"mass": a_s.mean(-1), "routed_frac": (a_s >= 0.5).double().mean(-1), "min_a": a_s.amin(-1),
            "prefix_mass": ref[..., :num_prefix].sum(-1).mean(-1)}
    for k, v in want.items():
        np.testing.assert_allclose(d[k][:, block], v.numpy(), rtol=1e-4, atol=1e-5, err_msg=k)


@torch.no_grad()
def zeroed_value_relrms(forward: Callable[[], torch.Tensor], linear: nn.Module, token: int, rows: slice,
                        patches: slice | list[int]) -> np.ndarray:
    """Per image: the relative RMS change of the final tokens `patches` of `forward()` (a library's own forward, final
    tokens (B, N, dim)) when the output features `rows` of `linear` (one head's value) are zeroed at `token` by a
    forward hook (float64 metric)."""

    def zero_value(_m: nn.Module, _inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[:, token, rows] = 0.0
        return out

    base = forward()
    handle = linear.register_forward_hook(zero_value)
    try:
        edited = forward()
    finally:
        handle.remove()
    return patch_relrms(base[:, patches], edited[:, patches])


def patch_relrms(base: torch.Tensor, edited: torch.Tensor) -> np.ndarray:
    """Per image: the relative RMS change from `base` to `edited` patches (B, n, dim), in float64."""
    base, edited = base.double(), edited.double()
    energy = ((edited - base) ** 2).sum(-1).mean(1)
    return (energy / (base**2).sum(-1).mean(1)).sqrt().numpy()
