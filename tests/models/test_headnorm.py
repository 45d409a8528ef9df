"""Head-wise RMSNorm (`vitsinks.models.mitigations.headnorm`, `model.headnorm`): the module against a hand loop in
float64 and a hand-computed case, its place in the attention (after A v, before the output projection, on every
kernel), and what the diagnostics read on a normalised head output. The mitigation-generic checks run for it from the
registry in tests/test_contract.py and tests/models/test_mitigations.py."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.tiny import images, tiny_vit
from vitsinks.configs.schema import load_config
from vitsinks.diagnostics.core import diagnose_tokens
from vitsinks.models import MITIGATIONS, SinkAttention, run_variant
from vitsinks.models.attention import set_fused_attention
from vitsinks.models.mitigations.headnorm import EPS, HeadRMSNorm

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def naive_headnorm(x: torch.Tensor, gain: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Each (image, head, token) row of `x` (B, H, N, hd) over the root of its mean square plus eps, times the head's
    gain, in float64, one row at a time."""
    B, H, N, D = x.shape
    x, gain = x.double(), gain.double().view(H, D)  # the gain is stored flat, head by head
    out = torch.empty_like(x)
    for b in range(B):
        for h in range(H):
            for n in range(N):
                row = x[b, h, n]
                rms = math.sqrt(sum(float(c) ** 2 for c in row) / D + eps)
                out[b, h, n] = gain[h] * row / rms
    return out


def test_the_module_equals_a_hand_loop_in_float64_and_float32() -> None:
    g = torch.Generator().manual_seed(0)
    norm = HeadRMSNorm(3, 8)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0, generator=g)  # a gain of its own per head and channel
    x = torch.randn(2, 3, 5, 8, generator=g) * 10
    x[0, 1, 2] = 0.0  # a head that adds nothing at a token stays 0
    want = naive_headnorm(x, norm.weight.detach())
    torch.testing.assert_close(norm.double()(x.double()), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(norm.float()(x).double(), want, rtol=1e-5, atol=1e-6)
    assert not norm(x)[0, 1, 2].any()


def test_a_hand_computed_row() -> None:
    norm = HeadRMSNorm(1, 2, eps=0.0)
    x = torch.tensor([[[[3.0, 4.0], [0.0, -2.0]]]])  # RMS 5 / sqrt(2) and sqrt(2)
    torch.testing.assert_close(norm(x), torch.tensor([[[[3 * 2**0.5 / 5, 4 * 2**0.5 / 5], [0.0, -2**0.5]]]]))
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, -1.0]))
    torch.testing.assert_close(norm(x * 7.0), torch.tensor([[[[6 * 2**0.5 / 5, -4 * 2**0.5 / 5], [0.0, 2**0.5]]]]))


def test_the_switch_builds_it_into_every_blocks_attention_with_a_unit_gain_per_head() -> None:
    m = MITIGATIONS["headnorm"]
    assert (m.site, m.attr, m.setting(m.example), m.tag(True)) == ("outputs", "headnorm", True, "headnorm")
    model = tiny_vit(headnorm=True)
    for blk in model.blocks:
        assert isinstance(blk.attn.headnorm, HeadRMSNorm) and torch.equal(blk.attn.headnorm.weight, torch.ones(3 * 16))
    assert set(model.state_dict()) - set(tiny_vit().state_dict()) == {f"blocks.{i}.attn.headnorm.weight"
                                                                      for i in range(2)}
    cfg = load_config(["exp=headnorm"])
    assert cfg.model.headnorm is True and run_variant(cfg) == "headnorm"
    assert run_variant(load_config(["exp=headnorm", "model.gate=elementwise"])) == "gate+headnorm"


@pytest.mark.parametrize("kind", ["softmax", "softpick"])
def test_the_attention_normalises_a_v_before_the_gate_and_the_output_projection(kind: str) -> None:
    """Forward = W_O (gate * headnorm(A v)) + b, written out from the explicit internals, on every kernel."""
    torch.manual_seed(0)
    attn = SinkAttention(48, 3, qkv_bias=True, attn=kind, headnorm=True, gate="elementwise").double().eval()
    with torch.no_grad():
        attn.headnorm.weight.uniform_(0.5, 2.0)
    x = torch.randn(2, 7, 48, dtype=torch.float64)
    with torch.no_grad():  # FlexAttention on the CPU: inference only
        it = attn.internals(x)
        heads = naive_headnorm(it.attn @ it.v, attn.headnorm.weight)  # (B, H, N, hd)
        merged = (heads.transpose(1, 2) * it.gate).reshape(2, 7, 48)
        want = merged @ attn.proj.weight.T + attn.proj.bias
        for mode in ("off", "sdpa", "flex"):
            attn.fused_mode = mode
            torch.testing.assert_close(attn(x), want, rtol=1e-10, atol=1e-10)


def test_the_diagnostics_read_the_values_before_the_norm_and_the_heads_shares_after_it() -> None:
    """Block 0 of a model with and without the norm (the same weights) has the same A and v: the sink fields, the
    value ratios and the stable rank (read from A and v) agree; the heads' shares of the update (read at the output
    projection's input) do not. The explicit recomputation of the normalised block matches its forward."""
    torch.manual_seed(0)
    normed = tiny_vit(headnorm=True).eval()
    with torch.no_grad():
        for blk in normed.blocks:
            blk.attn.headnorm.weight.uniform_(0.2, 3.0)
    plain = tiny_vit().eval()
    plain.load_state_dict({k: v for k, v in normed.state_dict().items() if "headnorm" not in k})
    x = normed.embed_tokens(images(4))
    d_normed, d_plain = (diagnose_tokens(m.blocks[:1], x) for m in (normed, plain))
    for k in ("sink_idx", "mass", "ratio_head", "ratio_out", "stable_rank", "concentration"):
        torch.testing.assert_close(torch.as_tensor(d_normed[k]), torch.as_tensor(d_plain[k]), msg=k)
    assert not torch.allclose(torch.as_tensor(d_normed["update_share"]), torch.as_tensor(d_plain["update_share"]))
    set_fused_attention(normed, "sdpa")
    assert diagnose_tokens(normed.blocks, x)["recompute_error"].max() < 1e-5
