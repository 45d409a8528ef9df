"""DINOv3 through the views (small random configs, no hub): transformers' `DINOv3ViTModel` and timm's DINOv3 `Eva`s,
a [CLS], 4 registers and a rotary position embedding on the patches, on non-square images (the RoPE depends on the
grid). The views reproduce each library's own forward, block by block; their attention is the library's own eager
attention and their fields a float64 recomputation from it; a sink planted on a register is found there, and zeroing
its value through `intervene` moves the final patches as the library's own forward with that value zeroed by a hook."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from timm.models.eva import Eva
from torch import nn

from tests.helpers.adapter_checks import assert_fields_match_attention, patch_relrms, zeroed_value_relrms
from tests.helpers.neuron_tables import assert_table_equals, summary_rows
from tests.helpers.tiny_models import dinov3 as build
from vitsinks.diagnostics.core import diagnose_tokens
from vitsinks.pretrained import adapt, diagnose, intervene
from vitsinks.pretrained.edit_calls import fit_w8a8
from vitsinks.utils.errors import BadValue

DIM, HEADS, HEAD_DIM, REGISTERS, PATCH = 48, 3, 16, 4, 8
MODELS = ("hf", "hf_gated", "timm", "timm_qkvb")


def images(n: int = 3, size: tuple[int, int] = (32, 48)) -> torch.Tensor:
    return torch.randn(n, 3, *size, generator=torch.Generator().manual_seed(1))


def is_hf(m: nn.Module) -> bool:
    return not isinstance(m, Eva)


def library_forward(m: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The library's own final tokens and every block's output (forward hooks)."""
    outs: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda _m, _i, o: outs.append(o[0] if isinstance(o, tuple) else o))
             for b in (m.model.layer if is_hf(m) else m.blocks)]
    try:
        final = m(pixel_values=x).last_hidden_state if is_hf(m) else m.forward_features(x)
    finally:
        for h in hooks:
            h.remove()
    return final, outs


def library_attention(m: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Every block's attention probabilities (B, H, N, N) as the library's own eager path computes them."""
    if is_hf(m):
        m.set_attn_implementation("eager")  # SDPA ignores output_attentions
        return list(m(pixel_values=x, output_attentions=True).attentions)
    probs: list[torch.Tensor] = []
    hooks = []
    for blk in m.blocks:
        blk.attn.fused_attn = False  # EvaAttention's explicit path: softmax, then attn_drop (identity in eval)
        hooks.append(blk.attn.attn_drop.register_forward_hook(lambda _m, _i, o: probs.append(o)))
    try:
        m.forward_features(x)
    finally:
        for h in hooks:
            h.remove()
    return probs


@pytest.mark.parametrize("name", MODELS)
@torch.no_grad()
def test_views_reproduce_the_model(name: str) -> None:
    m = build(name)
    f, x = adapt(m), images()
    assert f.family == ("transformers" if is_hf(m) else "timm_eva") and (f.num_cls, f.num_registers) == (1, REGISTERS)
    final, outs = library_forward(m, x)
    t = f.embed(x)
    for blk, want in zip(f.blocks, outs, strict=True):
        out, _ = blk.forward_explicit(t)
        t = blk(t)
        torch.testing.assert_close(t, want, rtol=1e-5, atol=1e-5)
        assert (out - t).abs().max() <= 1e-5 * t.abs().max()
    torch.testing.assert_close(f.readout(t), final, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
@torch.no_grad()
def test_attention_and_fields_equal_the_library(name: str) -> None:
    m = build(name)
    f, x = adapt(m), images()
    want = library_attention(m, x)
    t = f.embed(x)
    d = diagnose_tokens(f.blocks, t, num_prefix=f.num_prefix)
    for i, (blk, a) in enumerate(zip(f.blocks, want, strict=True)):
        torch.testing.assert_close(blk.attn.internals(blk.norm1(t)).attn, a, rtol=1e-5, atol=1e-6)
        assert_fields_match_attention(d, a, f.num_prefix, block=i)
        t = blk(t)


def plant_register_sink(m: nn.Module, x: torch.Tensor, block: int, head: int, register: int) -> tuple[nn.Module, slice]:
    """Head `head` of block `block` attends to register `register` from every query: one channel of the normed input
    is 1 on every token and every query reads only it (one vector u), and only the register (massive in another
    channel) has a key along u. u is the rotary dimension that turns least over the grid, so the rotated patch queries
    still point at the (unrotated) register key. Returns the Linear whose output holds the head's value and its rows."""
    rows = slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)
    if is_hf(m):
        layer = m.model.layer[block]
        a, norm1, reg = layer.attention, layer.norm1, m.embeddings.register_tokens
        wq, wk, bq, value = a.q_proj.weight[rows], a.k_proj.weight[rows], a.q_proj.bias[rows], (a.v_proj, rows)
        cos = m.rope_embeddings(x)[0]
    else:
        blk = m.blocks[block]
        w, norm1, reg = blk.attn.qkv.weight, blk.norm1, m.reg_token
        wq, wk, bq = w[rows], w[DIM + rows.start : DIM + rows.stop], None
        value = (blk.attn.qkv, slice(2 * DIM + rows.start, 2 * DIM + rows.stop))
        cos = m._pos_embed(m.patch_embed(x))[1].chunk(2, -1)[1]
    u = torch.zeros(HEAD_DIM)
    u[int(cos.amin(0).argmax())] = 1.0
    constant, massive = 7, 5
    with torch.no_grad():
        norm1.weight[constant], norm1.bias[constant] = 0.0, 1.0
        wq.zero_()
        wq[:, constant] = 3 * u
        if bq is not None:
            bq.zero_()
        wk.zero_()
        wk[:, massive] = 10 * u
        reg[0, register, massive] = 50.0
    return value


@pytest.mark.parametrize("name", ("hf", "timm"))
def test_a_sink_on_a_register(name: str) -> None:
    m = build(name)
    x, block, head, register = images(4), 0, 1, 2
    linear, rows = plant_register_sink(m, x, block, head, register)
    tables = diagnose(m, x)
    layout = tables["layout"]
    assert (int(layout["num_cls"][0]), int(layout["num_registers"][0]), int(layout["num_prefix"][0])) == (1, 4, 5)
    heads = tables["heads"]
    on = (heads["block"] == block) & (heads["head"] == head)
    assert set(heads["sink_location"][on]) == {"register"} and set(heads["sink_idx"][on]) == {1 + register}
    assert heads["routed_frac"][on].min() >= 0.9 and tables["checks"]["recompute_error"].max() < 1e-4
    got = intervene(m, x, heads=[(block, head)], edits=["zero_sink_value"], batch_size=4)
    rows_ = got["rows"]
    assert set(rows_["edit"]) == {"zero_sink_value"} and set(rows_["sink_loc"]) == {"register"}

    def forward() -> torch.Tensor:
        return m(pixel_values=x).last_hidden_state if is_hf(m) else m.forward_features(x)

    want = zeroed_value_relrms(forward, linear, 1 + register, rows, slice(1 + REGISTERS, None))
    assert want.min() > 1e-3  # the edit moves the patches
    np.testing.assert_allclose(rows_["final_patch_relrms"], want, rtol=1e-4)


@pytest.mark.parametrize("name", ("hf", "timm"))
@torch.no_grad()
def test_drop_registers_equals_the_model_without_registers(name: str) -> None:
    """`drop_registers` runs the library's own blocks on [CLS] and the patches (timm's `EvaAttention` with its prefix
    count set for the call): the same model built without registers, with the same weights, is the truth."""
    m, bare = build(name), build(name, registers=0)
    registers = ("embeddings.register_tokens", "reg_token")
    got = bare.load_state_dict({k: v for k, v in m.state_dict().items() if k not in registers}, strict=False)
    assert set(got.missing_keys) <= set(registers) and not got.unexpected_keys  # transformers keeps a (1, 0, dim)
    x = images(4)
    got = intervene(m, x, edits=["drop_registers"], batch_size=4)["rows"]
    assert set(got["edit"]) == {"drop_registers"}
    base, _ = library_forward(m, x)
    final, _ = library_forward(bare, x)
    np.testing.assert_allclose(got["final_patch_relrms"], patch_relrms(base[:, 1 + REGISTERS :], final[:, 1:]),
                               rtol=1e-4)


@torch.no_grad()
def test_a_stale_rotary_embedding_is_refused() -> None:
    f = adapt(build("timm"))
    t = f.embed(images(1, (48, 48)))
    f.embed(images(1, (32, 32)))  # the kept RoPE is now 32 px's
    with pytest.raises(BadValue, match="rotary"):
        f.blocks[0](t)


@pytest.mark.parametrize(("option", "named"), [({"use_post_norm": True}, "EvaBlockPostNorm"),
                                               ({"attn_type": "rope"}, "AttentionRope"),
                                               ({"rope_type": "mixed"}, "RotaryEmbeddingMixed")])
def test_unchecked_eva_options_are_refused(option: dict[str, object], named: str) -> None:
    m = Eva(img_size=32, patch_size=PATCH, embed_dim=32, depth=1, num_heads=2, num_reg_tokens=REGISTERS,
            use_abs_pos_emb=False, use_rot_pos_emb=True, **option)
    with pytest.raises(BadValue, match=named):
        adapt(m)


def test_eva_mlp_parts_and_w8a8_on_a_biased_fused_qkv() -> None:
    m = build("timm")
    blk, parts = m.blocks[1], adapt(m).blocks[1].mlp_parts()
    assert (parts.fc_in, parts.act, parts.fc_out, parts.gamma) == (blk.mlp.fc1, blk.mlp.act, blk.mlp.fc2, blk.gamma_2)
    with pytest.raises(BadValue, match="F.linear"):  # its qkv Linear is never called: no input hook would see it
        fit_w8a8(build("timm_qkvb"), images(2))


@torch.no_grad()
def test_transformers_register_neurons_equal_a_recomputation_from_its_forward() -> None:
    """The plain MLP (up_proj -> act_fn -> down_proj) gives the register-neuron summary, equal to the one recomputed in
    numpy from transformers' own forward (hooked activations and block outputs, `lambda1` of the second layer scale
    in the share); the gated MLP gives none (its activation is only the gate)."""
    m, x, k = build("hf"), images(4), 1.05
    layers, acts = m.model.layer, {}
    hooks = [la.mlp.act_fn.register_forward_hook(lambda _m, _i, o, b=b: acts.__setitem__(b, o.double().numpy()))
             for b, la in enumerate(layers)]
    try:
        _, outs = library_forward(m, x)
    finally:
        for h in hooks:
            h.remove()
    want = summary_rows([acts[b] for b in range(len(layers))], [o.double().numpy() for o in outs],
                        [la.mlp.down_proj.weight.double().numpy() for la in layers],
                        [la.layer_scale2.lambda1.double().numpy() for la in layers], k, 1 + REGISTERS, 10)
    assert len(want) == 10 * len(layers)  # every block has outlier patches at this k: nothing compared is empty
    assert_table_equals(diagnose(m, x, neurons=k)["neurons"], want)
    assert all(blk.mlp_parts() is None for blk in adapt(build("hf_gated")).blocks)
