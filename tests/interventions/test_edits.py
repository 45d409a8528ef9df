"""vitsinks' controls of the interventions (docs/fidelity.md): the noise and cross-image shuffle of a sink value and
the register controls at a block's input, against their definitions, planted models whose answer is known and the
model's own forward with the edit made by a hook."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.strong_sink import hand_relrms
from tests.helpers.tiny import tiny_vit
from vitsinks.backbones import adapt
from vitsinks.configs.schema import InterveneConfig
from vitsinks.interventions import intervene, stage_one
from vitsinks.interventions.edits import (
    REGISTER_EDITS,
    Draws,
    derangement,
    register_control,
    resolve_edits,
    value_edit,
)
from vitsinks.interventions.report import to_markdown, write_outputs
from vitsinks.models import SinkViT, build_vit

OLD_EDITS = ["zero_sink_value", "donor_sink_value", "donor_nonsink_value", "zero_random_nonsink_value"]
NEW_EDITS = ["noise_sink_value", "shuffle_sink_value", *REGISTER_EDITS]


def _draws(b: int, noise: torch.Tensor | None = None, shuffle: torch.Tensor | None = None) -> Draws:
    return Draws(torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.long), noise, shuffle)


def test_noise_sink_value_keeps_the_sink_norm_and_draws_a_new_direction() -> None:
    g = torch.Generator().manual_seed(0)
    v = torch.randn(6, 5, 8, generator=g, dtype=torch.float64)
    sink = torch.tensor([0, 4, 2, 1, 3, 0])
    e = value_edit("noise_sink_value", v, sink, None, None, _draws(6, noise=torch.randn(6, 8, generator=g)))
    vs = v[torch.arange(6), sink]
    assert torch.equal(e.pos, sink)
    assert torch.allclose(e.new.norm(dim=-1), vs.norm(dim=-1), rtol=1e-12, atol=0)
    unit = e.new / e.new.norm(dim=-1, keepdim=True)
    cos = unit @ unit.T
    assert (cos - torch.eye(6, dtype=cos.dtype)).abs().max() < 0.999  # a different direction per image
    assert (torch.nn.functional.cosine_similarity(e.new, vs, dim=-1).abs() < 0.999).all()  # not the sink's own
    again = value_edit("noise_sink_value", v, sink, None, None, _draws(6, noise=torch.randn(6, 8, generator=g)))
    assert not torch.allclose(again.new, e.new)  # another draw, another direction
    zero = value_edit("noise_sink_value", torch.zeros_like(v), sink, None, None, _draws(6, torch.randn(6, 8)))
    assert not zero.new.any()  # a zero sink value gets a zero vector (norm 0)
    with pytest.raises(ValueError, match="normal vectors"):
        value_edit("noise_sink_value", v, sink, None, None, _draws(6))


def test_the_derangement_moves_every_image_reaches_every_derangement_and_follows_its_seed() -> None:
    g = torch.Generator().manual_seed(3)
    seen = set()
    for n in (2, 3, 4, 7):
        for _ in range(100 if n != 4 else 300):
            pi = derangement(n, g)
            assert sorted(pi.tolist()) == list(range(n)) and (pi != torch.arange(n)).all()
            if n == 4:
                seen.add(tuple(pi.tolist()))
    assert len(seen) == 9  # the 9 derangements of 4 (a miss has probability ~1e-14)
    assert derangement(2, g).tolist() == [1, 0]
    draw = [derangement(8, torch.Generator().manual_seed(s)).tolist() for s in (5, 5, 6)]
    assert draw[0] == draw[1] and draw[0] != draw[2]
    with pytest.raises(ValueError, match="at least 2"):
        derangement(1, g)


def test_shuffle_sink_value_takes_image_pi_b_sink_value_to_image_b_own_sink() -> None:
    v = torch.randn(4, 6, 3, generator=torch.Generator().manual_seed(1))
    sink, pi = torch.tensor([0, 4, 2, 5]), torch.tensor([2, 3, 1, 0])
    e = value_edit("shuffle_sink_value", v, sink, None, None, _draws(4, shuffle=pi))
    assert torch.equal(e.pos, sink) and torch.equal(e.new, torch.stack([v[2, 2], v[3, 5], v[1, 4], v[0, 0]]))


def test_register_controls_edit_the_registers_only() -> None:
    x = torch.randn(3, 7, 4, generator=torch.Generator().manual_seed(2))
    mean, pi = torch.randn(2, 4), torch.tensor([1, 2, 0])
    for name, expected in (("zero_registers", torch.zeros(3, 2, 4)), ("mean_registers", mean.expand(3, 2, 4)),
                           ("shuffle_registers", x[pi, 1:3])):
        out = register_control(name, x, 2, mean, pi)
        assert torch.equal(out[:, 1:3], expected)
        assert torch.equal(out[:, :1], x[:, :1]) and torch.equal(out[:, 3:], x[:, 3:])


def test_register_controls_need_registers_and_the_new_edits_are_defaults() -> None:
    for e in REGISTER_EDITS:
        with pytest.raises(ValueError, match="register tokens"):
            resolve_edits([e], (), 0)
    assert {"noise_sink_value", "shuffle_sink_value"} <= set(resolve_edits([], (), 0))
    assert not set(REGISTER_EDITS) & set(resolve_edits([], (), 0))
    assert set(REGISTER_EDITS) <= set(resolve_edits([], (), 2))


def _zero_value_sink_vit() -> SinkViT:
    """2 blocks, 2 heads, no registers. [CLS] enters block 0 as exactly 0, so its normed token is 0 and its query,
    key and value are the qkv biases; head 0:0's value bias is 0 (v_[CLS] = 0 exactly, every patch's value as
    initialised), its queries are all u / scale and its keys -100 z_j[c] u: channel c of every patch is a constant
    100 that dominates its normed token (z_j[c] ~ 6.8), so every patch scores ~680 nats below [CLS]."""
    torch.manual_seed(0)
    model = tiny_vit(num_heads=2).eval()
    attn, dim, c = model.blocks[0].attn, 48, 5
    hd = attn.head_dim
    u = torch.zeros(hd)
    u[0] = 1.0
    with torch.no_grad():
        model.cls_token.zero_()
        model.pos_embed[:, 0].zero_()
        model.pos_embed[:, 1:, c] = 0.0
        model.patch_embed.proj.weight[c] = 0.0
        model.patch_embed.proj.bias[c] = 100.0
        w, b = attn.qkv.weight, attn.qkv.bias
        w[:hd], b[:hd] = 0.0, u / attn.scale
        w[dim : dim + hd], b[dim : dim + hd] = -100.0 * torch.outer(u, torch.eye(dim)[c]), 0.0
        b[2 * dim : 2 * dim + hd] = 0.0
    return model


def test_a_zero_value_nop_sink_is_left_unchanged_by_noise_and_shuffle_as_by_zero_and_mean() -> None:
    model = _zero_value_sink_vit()
    x = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    subject = adapt(model.eval())
    with torch.no_grad():
        blk = model.blocks[0]
        it = blk.attn.internals(blk.norm1(model.embed_tokens(x)))
    assert (it.attn[:, 0, :, 0] == 1.0).all() and not it.v[:, 0, 0].any()  # the plant: A_:0 = 1, v_[CLS] = 0
    st = InterveneConfig(n_images=6, heldout_images=4, heads=["0:0"], batch_size=6, edits=[
        "zero_sink_value", "mean_sink_value", "noise_sink_value", "shuffle_sink_value", "donor_nonsink_value"])
    res = intervene(subject, x[:6], None, x[6:], st, stage1=stage_one(subject, x[:6], 6), progress=False)
    change = {e: [r["final_patch_relrms"] for r in res.rows if r["edit"] == e] for e in st.edits}
    assert all(len(v) == 6 for v in change.values()) and {r["sink_idx"] for r in res.rows} == {0}
    for e in ("zero_sink_value", "mean_sink_value", "noise_sink_value", "shuffle_sink_value"):
        assert max(change[e]) < 1e-7, e  # float32 rounding (the fused vs the explicit attention of other heads)
    # the sink is used: a nonzero value there moves the patches (by far less than 1, beside their constant channel)
    assert min(change["donor_nonsink_value"]) > 1e-4


def _reg_vit(depth: int = 3, num_heads: int = 2) -> SinkViT:
    torch.manual_seed(0)
    return build_vit("vit_cpu", img_size=32, patch_size=8, embed_dim=48, depth=depth, num_heads=num_heads,
                     registers=2, layerscale_init=0.5, prefix_init_std=1.0).eval()


def _events(subject: object, x: torch.Tensor) -> dict[str, np.ndarray]:
    d = stage_one(subject, x, len(x))
    d["routed_frac"][:] = 1.0  # every head "has" events, so any can be named
    return d


def _rows(res: object, edit: str) -> list[dict]:
    return [r for r in res.rows if r["edit"] == edit]


def _same(a: list[dict], b: list[dict]) -> bool:
    """Row lists equal entry by entry, NaN equal to NaN (a coherence of no change)."""
    return len(a) == len(b) and all(repr(x) == repr(y) for x, y in zip(a, b, strict=True))


def _replay_shuffle(seed: int, batches: list[tuple[int, int]], n_heads: int, hd: int) -> list[int]:
    """The stated protocol, replayed: the controls generator seeded seed + 500; per batch a randperm redrawn until
    it has no fixed point, then per head one (B, hd) normal draw. The donor (position) of every image."""
    gen, out = torch.Generator().manual_seed(seed + 500), []
    for lo, hi in batches:
        while (pi := torch.randperm(hi - lo, generator=gen)).eq(torch.arange(hi - lo)).any():
            pass
        out += (lo + pi).tolist()
        for _ in range(n_heads):
            torch.randn(hi - lo, hd, generator=gen)
    return out


def test_the_new_edits_leave_the_old_rows_unchanged_and_follow_the_seed() -> None:
    model = _reg_vit()
    subject = adapt(model.eval())
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    d = _events(subject, x[:6])

    def run(edits: list[str], seed: int = 3) -> object:
        st = InterveneConfig(n_images=6, heldout_images=2, heads=["1:0", "2:1"], edits=edits, batch_size=3, seed=seed)
        return intervene(subject, x[:6], None, x[6:], st, stage1=d, progress=False)

    old, both = run(OLD_EDITS), run(OLD_EDITS + NEW_EDITS)
    again, other = run(NEW_EDITS), run(["noise_sink_value"], seed=4)
    assert _same([r for r in both.rows if r["edit"] in OLD_EDITS], old.rows)  # identical, draws included
    for edit in NEW_EDITS:  # the same seed, the same rows, whichever other edits run
        assert _same(_rows(again, edit), _rows(both, edit)) and _rows(again, edit), edit
    noise = np.array([r["final_patch_relrms"] for r in _rows(again, "noise_sink_value")])
    assert (noise > 0).all() and not np.allclose(noise, [r["final_patch_relrms"]
                                                         for r in _rows(other, "noise_sink_value")])
    replayed = _replay_shuffle(3, [(0, 3), (3, 6)], 2, 24)  # batch 2's pi comes after batch 1's noise draws
    for edit in ("shuffle_sink_value", "shuffle_registers"):
        rows = _rows(again, edit)
        assert all(r["donor_index"] == replayed[r["image"]] != r["image_index"] for r in rows)
    reg = _rows(again, "zero_registers")
    assert sorted({r["block"] for r in reg}) == [0, 1, 2] and {r["head"] for r in reg} == {-1} and len(reg) == 18
    assert again.register_mean_source == "2 held-out images"


def test_zero_and_shuffle_registers_equal_the_models_own_forward_with_the_registers_replaced(tmp_path: Path) -> None:
    model = _reg_vit()
    subject = adapt(model.eval())
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    st = InterveneConfig(n_images=4, heldout_images=0, edits=["drop_registers", "zero_registers",
                                                               "shuffle_registers"], batch_size=4)
    res = intervene(subject, x, None, x[:0], st, stage1=_events(subject, x), progress=False)

    def replaced(block: int, source: list[int] | None) -> torch.Tensor:
        """The final tokens with the registers entering `block` set to 0 (or to image source[b]'s), by a hook."""
        def hook(mod: torch.nn.Module, args: tuple) -> tuple:
            t = args[0].clone()
            t[:, 1:3] = 0.0 if source is None else args[0][source, 1:3]
            return (t, *args[1:])

        handle = model.blocks[block].register_forward_pre_hook(hook)
        with torch.no_grad():
            out = model.norm(model.blocks(model.embed_tokens(x)))
        handle.remove()
        return out

    with torch.no_grad():
        base = model.norm(model.blocks(model.embed_tokens(x)))
    for b in range(3):
        zero = [r["final_patch_relrms"] for r in _rows(res, "zero_registers") if r["block"] == b]
        assert np.allclose(zero, hand_relrms(base, replaced(b, None), [-1] * 4), rtol=1e-5, atol=1e-8)
        shuffled = [r for r in _rows(res, "shuffle_registers") if r["block"] == b]
        source = [r["donor_index"] for r in shuffled]  # split index = position here
        ours = [r["final_patch_relrms"] for r in shuffled]
        assert np.allclose(ours, hand_relrms(base, replaced(b, source), [-1] * 4), rtol=1e-5, atol=1e-8)
        assert min(zero) > 0
        # block 0's registers are the learned tokens, the same in every image: another image's change nothing
        assert (max(ours) == 0) if b == 0 else (min(ours) > 0)
    summary = write_outputs(tmp_path, res.rows, {"subject": "reg", "n_images": 4, "n_blocks": 3, "selected": [],
                                                 "edits": res.edits, "min_class_events": 1,
                                                 "checks": res.checks.as_dict()})
    model_scope = summary["by_class"]["whole model"]["model"]
    drop = [r["final_patch_relrms"] for r in _rows(res, "drop_registers")]
    assert model_scope["drop_registers"]["heads"] == ["all"]
    assert model_scope["drop_registers"]["final_patch_relrms"] == pytest.approx(np.mean(drop), rel=1e-12)
    assert model_scope["zero_registers"]["heads"] == ["1:in", "2:in"]  # block 0 apart: in the per-block table only
    assert model_scope["zero_registers"]["final_patch_relrms"] == pytest.approx(
        np.mean([r["final_patch_relrms"] for r in _rows(res, "zero_registers") if r["block"] > 0]), rel=1e-12)
    per_block = [r for r in summary["register_controls"] if r["edit"] == "zero_registers"]
    assert [r["block"] for r in per_block] == [0, 1, 2] and per_block[1]["n"] == 4
    assert per_block[1]["final_patch_relrms"] == pytest.approx(
        np.mean([r["final_patch_relrms"] for r in _rows(res, "zero_registers") if r["block"] == 1]), rel=1e-12)
    text = to_markdown(summary)
    assert "## register controls by block input" in text and "| 1 | zero_registers | 4 |" in text


def test_mean_registers_from_the_same_image_change_nothing() -> None:
    model = _reg_vit()
    subject = adapt(model.eval())
    img = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    x = img.expand(2, -1, -1, -1).contiguous()  # the edited images: two copies of the held-out one
    st = InterveneConfig(n_images=2, heldout_images=1, edits=["mean_registers", "shuffle_registers"], batch_size=2)
    res = intervene(subject, x, None, img, st, stage1=_events(subject, x), progress=False)
    assert len(res.rows) == 2 * 2 * 3 and max(r["final_patch_relrms"] for r in res.rows) < 1e-6
    with pytest.raises(ValueError, match="mean_registers needs held-out images"):
        intervene(subject, x, None, x[:0], InterveneConfig(n_images=2, edits=["mean_registers"]),
                  stage1=_events(subject, x), progress=False)


def _self_attending_vit() -> SinkViT:
    """2 blocks, 1 head, 2 registers: queries 1000 z, keys z (z the normed token, ||z||^2 = 48): every token's own
    key leads every other by 1000 / sqrt(48) * (48 - z_i . z_j) nats, so nothing attends to the registers (their
    weight is exactly 0 in float32) whatever they hold; [CLS] and registers drawn with std 1 (distinct tokens)."""
    model = _reg_vit(depth=2, num_heads=1)
    with torch.no_grad():
        for blk in model.blocks:
            w, b = blk.attn.qkv.weight, blk.attn.qkv.bias
            w[:48], w[48:96] = 1000.0 * torch.eye(48), torch.eye(48)
            b[:96] = 0.0
    return model


def test_register_controls_change_nothing_where_no_token_attends_to_the_registers() -> None:
    model = _self_attending_vit()
    subject = adapt(model.eval())
    x = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():  # the plant: no query but a register's puts any weight on a register key
        t = model.embed_tokens(x)
        for blk in model.blocks:
            t, it = blk.forward_explicit(t)
            assert not it.attn[:, :, [0, *range(3, 19)]][..., 1:3].any()
    st = InterveneConfig(n_images=4, heldout_images=2, edits=["drop_registers", *REGISTER_EDITS], batch_size=4)
    res = intervene(subject, x[:4], None, x[4:], st, stage1=_events(subject, x[:4]), progress=False)
    assert len(res.rows) == 4 * (1 + 3 * 2)
    assert max(r["final_patch_relrms"] for r in res.rows) < 1e-6
