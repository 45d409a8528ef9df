"""The edits and the register-neuron summary through the open_clip views (small random towers, no hub): W8A8 equals
`quant.w8a8.W8A8` on vitsinks' own ViT with the converted weights (the calibrated scales, the final tokens through the
views and open_clip's own forward); the neuron table equals a numpy recomputation from open_clip's own forward."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.helpers.neuron_tables import assert_table_equals, summary_rows
from tests.helpers.open_clip_models import images, own_twin, tower
from vitsinks.backbones.views import own_linears
from vitsinks.pretrained import adapt, diagnose
from vitsinks.pretrained.edit_calls import apply_w8a8, fit_w8a8
from vitsinks.quant import W8A8
from vitsinks.quant.outliers import layer_paths
from vitsinks.utils.errors import BadValue


@pytest.mark.parametrize("ls", (0.1, None))
@torch.no_grad()
def test_w8a8_equals_vitsinks_own(ls: float | None) -> None:
    v = tower(ls)
    own = own_twin(v, ls)
    x, calib = images(3), images(5)[3:]
    f = adapt(v)
    before = f.forward_features(x)
    assert list(layer_paths(f)) == list(layer_paths(adapt(own)))  # a SinkViT's names: blocks.<i>.attn.qkv, ...
    state = fit_w8a8(v, calib)
    want = W8A8.fit(adapt(own), calib, SimpleNamespace(weight_bits=8, act_bits=8))
    assert state["layers"] == want["layers"]
    torch.testing.assert_close(state["act_max"], want["act_max"], rtol=1e-5, atol=0)
    assert not v.transformer.resblocks[0].attn._forward_hooks  # the calibration's hooks are gone
    got = apply_w8a8(v, state).forward_features(x)
    ref = W8A8.apply(adapt(own), want).forward_features(x)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(v(x), ref[:, 0] @ v.proj, rtol=1e-4, atol=1e-4)  # open_clip's own forward: W8A8 too
    assert 1e-4 < (got - before).norm() / before.norm() < 0.1  # quantised: changed, a little
    w = v.transformer.resblocks[1].attn.in_proj_weight
    q = w.double() / (w.abs().max().double() / 127)
    assert (q - q.round()).abs().max() < 1e-3  # in place, on the per-tensor grid
    assert diagnose(v, x)["checks"]["recompute_error"].max() < 1e-4  # the views' recomputation sees the same


def test_a_view_without_its_projections_refuses_the_multihead_attention() -> None:
    with pytest.raises(BadValue, match="nn.MultiheadAttention"):
        own_linears(tower().transformer.resblocks[0])


@pytest.mark.parametrize("ls", (0.1, None))
@torch.no_grad()
def test_neuron_summary_equals_a_recomputation_from_open_clips_forward(ls: float | None) -> None:
    v = tower(ls)
    x, k = images(4), 1.05
    blocks = v.transformer.resblocks
    acts: dict[int, np.ndarray] = {}
    outs: dict[int, np.ndarray] = {}
    for b, blk in enumerate(blocks):
        blk.mlp.gelu.register_forward_hook(lambda _m, _a, out, b=b: acts.__setitem__(b, out.double().numpy()))
        blk.register_forward_hook(lambda _m, _a, out, b=b: outs.__setitem__(b, out.double().numpy()))
    v(x)
    gammas = [blk.ls_2.gamma.double().numpy() if ls else None for blk in blocks]
    want = summary_rows([acts[b] for b in range(len(blocks))], [outs[b] for b in range(len(blocks))],
                        [blk.mlp.c_proj.weight.double().numpy() for blk in blocks], gammas, k, 1, 10)
    for blk in blocks:
        blk.mlp.gelu._forward_hooks.clear()
        blk._forward_hooks.clear()
    assert_table_equals(diagnose(v, x, neurons=k)["neurons"], want)
