"""Causal interventions (SPEC section 6): edits, metrics and selection against hand computations and the model's own
forward, and the theory's predictions on the synthetic tasks' trained models."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.strong_sink import cls_sink_vit, hand_relrms
from vitsinks.backbones import adapt
from vitsinks.configs.schema import InterveneConfig
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.interventions import intervene, stage_one
from vitsinks.interventions.edits import (
    Draws,
    ValueEdit,
    apply_value,
    check_value_edit,
    random_patch,
    resolve_edits,
    value_edit,
)
from vitsinks.interventions.engine import NoSinkHeads, patch_metrics, probe_metrics, select_heads
from vitsinks.interventions.report import by_class, by_head, to_markdown, write_outputs
from vitsinks.models import build_vit
from vitsinks.sinktasks.tasks import broadcast_batch, nop_batch, train_broadcast, train_nop


def test_value_edit_check_matches_the_closed_form_and_catches_a_misplaced_edit() -> None:
    g = torch.Generator().manual_seed(0)
    attn = torch.rand(3, 5, 5, generator=g).softmax(-1)
    v, w = torch.randn(3, 5, 4, generator=g), torch.randn(6, 4, generator=g)
    edit = ValueEdit(torch.tensor([0, 2, 4]), torch.randn(3, 4, generator=g))
    v_new = apply_value(v, edit)
    assert torch.equal(v_new[1, 2], edit.new[1]) and torch.equal(v_new[1, 3], v[1, 3])
    assert check_value_edit(attn, v, v_new, edit, w) < 1e-12
    wrong = apply_value(v, ValueEdit(torch.tensor([1, 2, 4]), edit.new))  # image 0 edited at the wrong token
    assert check_value_edit(attn, v, wrong, edit, w) > 1e-3


def test_random_patch_never_picks_the_excluded_token_or_a_prefix_token() -> None:
    g = torch.Generator().manual_seed(0)
    exclude = torch.tensor([0, 3, 7] * 200)
    j = random_patch(exclude, n_tokens=8, num_prefix=2, gen=g)
    assert (j >= 2).all() and (j < 8).all() and (j != exclude).all()
    assert set(j[exclude == 3].tolist()) == {2, 4, 5, 6, 7}  # every other patch is reachable


def test_value_edits_take_the_values_they_name() -> None:
    v = torch.randn(3, 6, 2, generator=torch.Generator().manual_seed(1))
    sink, donor = torch.tensor([0, 4, 2]), torch.tensor([1, 2, 0])
    own = torch.tensor([1, 5, 3])
    draws = Draws(own, torch.tensor([2, 1, 4]))
    e = value_edit("donor_sink_value", v, sink, donor, None, draws)
    assert torch.equal(e.pos, sink) and torch.equal(e.new, torch.stack([v[1, 4], v[2, 2], v[0, 0]]))
    e = value_edit("donor_nonsink_value", v, sink, donor, None, draws)
    assert torch.equal(e.pos, sink) and torch.equal(e.new, torch.stack([v[1, 2], v[2, 1], v[0, 4]]))
    mean = torch.ones(2)
    assert torch.equal(value_edit("mean_sink_value", v, sink, donor, mean, draws).new, torch.ones(3, 2))
    z = value_edit("zero_random_nonsink_value", v, sink, donor, None, draws)
    assert torch.equal(z.pos, own) and not z.new.any()
    with pytest.raises(ValueError, match="held-out"):
        value_edit("mean_sink_value", v, sink, donor, None, draws)
    with pytest.raises(ValueError, match="random patches"):
        value_edit("zero_random_nonsink_value", v, sink, donor, None, None)


@pytest.mark.parametrize(("requested", "present", "registers", "message"), [
    (["nope"], (), 0, "unknown edit"), (["open_gate"], (), 4, "needs a model with the gate mitigation"),
    (["drop_registers"], ("gate",), 0, "register tokens")])
def test_edits_that_do_not_apply_are_refused(requested: list[str], present: tuple[str, ...], registers: int,
                                             message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_edits(requested, present, registers)


def test_default_edits_follow_the_model() -> None:
    assert "open_gate" not in resolve_edits([], (), 0) and "drop_registers" not in resolve_edits([], (), 0)
    assert {"open_gate", "close_gate", "drop_registers"} <= set(resolve_edits([], ("gate",), 4))


def test_patch_metrics_against_hand_values() -> None:
    base = torch.zeros(2, 4, 3)
    base[..., 0] = 2.0  # every patch has norm 2
    common = base.clone()
    common[..., 1] += 1.0  # the same change at every patch: fully coherent
    m = patch_metrics(base, common, num_prefix=1, sink=torch.tensor([0, 2]))
    assert torch.allclose(m["final_patch_relrms"], torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert torch.allclose(m["coherence"], torch.ones(2, dtype=torch.float64))
    opposite = base.clone()
    opposite[:, 1, 1] += 1.0
    opposite[:, 2, 1] -= 1.0  # +d and -d: no common part
    m = patch_metrics(base, opposite, num_prefix=1, sink=torch.tensor([0, 0]))
    assert torch.allclose(m["coherence"], torch.zeros(2, dtype=torch.float64))
    assert math.isclose(float(m["final_patch_relrms"][0]), math.sqrt(2 / 3) / 2)
    m = patch_metrics(base, opposite, num_prefix=1, sink=torch.tensor([2, 0]))  # image 0: the sink patch is left out
    assert math.isclose(float(m["final_patch_relrms"][0]), math.sqrt(1 / 2) / 2)
    assert torch.isnan(patch_metrics(base, base, 1, None)["coherence"]).all()  # no change: undefined
    donor_base = base.clone()
    donor_base[1, 1:, 2] = 5.0  # image 1's patches differ from image 0's along axis 2
    moved = donor_base.clone()
    moved[0, 1:, 2] += 1.0  # image 0 moves towards its donor
    m = patch_metrics(donor_base, moved, 1, None, donor=torch.tensor([1, 0]))
    assert math.isclose(float(m["donor_cosine"][0]), 1.0)


def test_probe_metrics_against_hand_values() -> None:
    before = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    m = probe_metrics(before, before, torch.tensor([0, 0]))
    assert torch.equal(m["probe_agree"], torch.ones(2, dtype=torch.float64)) and m["probe_kl"].abs().max() < 1e-12
    assert torch.allclose(m["probe_correct"], torch.tensor([1.0, 0.0], dtype=torch.float64))
    after = torch.tensor([[0.0, 2.0], [0.0, 1.0]])
    m = probe_metrics(before, after, torch.tensor([0, 0]))
    p = torch.tensor([2.0, 0.0], dtype=torch.float64).softmax(0)
    q = torch.tensor([0.0, 2.0], dtype=torch.float64).softmax(0)
    assert math.isclose(float(m["probe_kl"][0]), float((p * (p / q).log()).sum()))
    assert math.isclose(float(m["probe_ce"][0]), -math.log(float(q[0])))
    assert m["probe_agree"].tolist() == [0.0, 1.0]


def _fields(counts: dict[tuple[int, int, int], int], n: int = 60) -> dict[str, np.ndarray]:
    """Fields of n images x 3 blocks x 2 heads with `counts[(block, head, class)]` events (class 0 NOP, 1 broadcast)."""
    d = {"routed_frac": np.zeros((n, 3, 2)), "min_a": np.zeros((n, 3, 2)), "ratio_out": np.full((n, 3, 2), 0.35),
         "stable_rank": np.ones((n, 3, 2))}
    for (b, h, cls), k in counts.items():
        d["routed_frac"][:k, b, h] = 1.0
        d["ratio_out"][:k, b, h] = 0.1 if cls == 0 else 0.9
    return d


def test_head_selection_follows_the_reference_protocol() -> None:
    d = _fields({(1, 0, 0): 55, (2, 1, 0): 58, (2, 0, 1): 51, (0, 1, 0): 52, (1, 1, 0): 49})
    assert select_heads(d, SinkRules(), 50, 16, 4) == [(2, 1), (1, 0), (0, 1), (2, 0)]  # ranked; 49 events: out
    assert select_heads(d, SinkRules(), 50, 1, 0) == [(2, 1), (2, 0)]  # top 1 per class, none of block 0
    with pytest.raises(NoSinkHeads, match="most per head: NOP 58, broadcast 51"):
        select_heads(d, SinkRules(), 59, 16, 4)


def _vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_vit("vit_cpu", img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=2, gate="elementwise",
                     registers=2, layerscale_init=0.5).eval()


def _without_token(model: torch.nn.Module, x: torch.Tensor, block: int, head: int,
                   pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(final tokens, final tokens with head `block:head`'s contribution through token pos[b] removed) by the
    model's own (fused) forward, a hook subtracting ls * W_O^h (g_i * A_ip v_p) from that block's attention output."""
    with torch.no_grad():
        blk, h_in = model.blocks[block], model.embed_tokens(x)
        for earlier in model.blocks[:block]:
            h_in = earlier(h_in)
        it = blk.attn.internals(blk.norm1(h_in))
        hd, batch = blk.attn.head_dim, torch.arange(len(x))
        contrib = it.attn[batch, head, :, pos].unsqueeze(-1) * it.v[batch, head, pos].unsqueeze(1)
        contrib = contrib * it.gate[:, :, head]  # (B, N, hd)
        delta = contrib @ blk.attn.proj.weight[:, head * hd : (head + 1) * hd].T  # LayerScale: the block's
        hook = blk.attn.register_forward_hook(lambda mod, inp, out: out - delta)
        edited = model.norm(model.blocks(model.embed_tokens(x)))
        hook.remove()
        return model.norm(model.blocks(model.embed_tokens(x))), edited


def test_zero_sink_value_equals_the_models_own_forward_with_the_closed_form_change() -> None:
    """A second path: the model's own (fused) forward without the sink's contribution to the head's output."""
    model, subject, x, d = _setup()
    st = InterveneConfig(n_images=4, heads=["1:1"], edits=["zero_sink_value"], batch_size=4)
    sink = torch.as_tensor(d["sink_idx"][:, 1, 1])
    base, expected = _without_token(model, x, 1, 1, sink)
    res = intervene(subject, x, None, x[:0], st, stage1=d, progress=False)
    ours = [r["final_patch_relrms"] for r in res.rows]
    assert [r["sink_idx"] for r in res.rows] == sink.tolist()
    assert np.allclose(ours, hand_relrms(base, expected, sink.tolist()), rtol=1e-4, atol=1e-7)
    assert min(ours) > 0
    assert float(res.checks.as_dict()["value_edit_error_max"]) < 1e-8
    assert float(res.checks.as_dict()["recompute_error_max"]) < 1e-4


def _setup(with_events: bool = True) -> tuple[torch.nn.Module, object, torch.Tensor, dict[str, np.ndarray]]:
    """The tiny gated ViT with registers, its subject, 4 images and stage-1 fields whose every head is a NOP event
    (or has no event), with the sinks the model really has."""
    model = _vit()
    x = torch.randn(4, 3, 32, 32)
    fill = np.ones if with_events else np.zeros
    d = {"routed_frac": fill((4, 3, 2)), "min_a": fill((4, 3, 2)), "ratio_out": np.zeros((4, 3, 2)),
         "stable_rank": np.ones((4, 3, 2)), "sink_idx": _sinks(model, x)}
    return model, adapt(model.eval()), x, d


def _sinks(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    """Sink positions of every (image, block, head), computed directly from the explicit attention."""
    out, h = [], model.embed_tokens(x)
    with torch.no_grad():
        for blk in model.blocks:
            h, it = blk.forward_explicit(h)
            out.append(it.attn.mean(-2).argmax(-1))
    return torch.stack(out, 1).numpy()


def test_gate_and_register_edits_change_what_they_should() -> None:
    model, subject, x, d = _setup()
    st = InterveneConfig(n_images=4, heads=["2:0"], edits=["open_gate", "close_gate", "drop_registers"], batch_size=4)
    res = intervene(subject, x, None, x[:0], st, stage1=d, progress=False)
    by_edit = {e: [r["final_patch_relrms"] for r in res.rows if r["edit"] == e] for e in st.edits}
    assert all(v > 0 for vals in by_edit.values() for v in vals)
    assert len(by_edit["drop_registers"]) == 4 and {r["block"] for r in res.rows if r["edit"] == "drop_registers"} \
        == {-1}
    with torch.no_grad():  # close_gate on the model's own forward: its attention output loses head 0's gated part
        blk = model.blocks[2]
        h_in = model.blocks[1](model.blocks[0](model.embed_tokens(x)))
        it = blk.attn.internals(blk.norm1(h_in))
        hd = blk.attn.head_dim
        delta = (it.gate[:, :, 0] * (it.attn[:, 0] @ it.v[:, 0])) @ blk.attn.proj.weight[:, :hd].T
        hook = blk.attn.register_forward_hook(lambda mod, inp, out: out - delta)
        closed = model.norm(model.blocks(model.embed_tokens(x)))
        hook.remove()
        base = model.norm(model.blocks(model.embed_tokens(x)))
    ours = [r["final_patch_relrms"] for r in res.rows if r["edit"] == "close_gate"]
    assert np.allclose(ours, hand_relrms(base, closed, d["sink_idx"][:, 2, 0].tolist()), rtol=1e-4, atol=1e-7)


def _by_class(rows: list[dict], n_blocks: int) -> dict:
    return by_class(by_head(rows), 20, n_blocks)


@pytest.fixture(scope="module")
def nop_result() -> dict:
    model, _ = train_nop(steps=1500, seed=0)
    x, _, _ = nop_batch(torch.Generator().manual_seed(7), batch=160)
    st = InterveneConfig(n_images=128, heldout_images=32, min_events=20)
    res = intervene(model.backbone(num_prefix=1), x[:128], None, x[128:], st, progress=False)
    return _by_class(res.rows, 1)["block 0 (only)"]["nop"]


@pytest.mark.slow
def test_nop_sink_on_the_synthetic_task_is_causally_a_nop(nop_result: dict) -> None:
    """Theory (SPEC section 6): zeroing or mean-replacing a NOP sink's value changes almost nothing, removing the
    attention to it changes a lot."""
    zero, mean = nop_result["zero_sink_value"], nop_result["mean_sink_value"]
    redirect_change = nop_result["redirect_sink_attention"]["final_patch_relrms"]
    assert zero["final_patch_relrms"] < 0.01 and mean["final_patch_relrms"] < 0.01
    assert redirect_change > 10 * max(zero["final_patch_relrms"], mean["final_patch_relrms"])


@pytest.mark.slow
def test_broadcast_sink_on_the_synthetic_task_moves_every_token_towards_the_donor() -> None:
    model, _ = train_broadcast(steps=1500, seed=0)
    x, _, _ = broadcast_batch(torch.Generator().manual_seed(7), batch=160)
    st = InterveneConfig(n_images=128, heldout_images=32, min_events=20,
                         edits=["zero_sink_value", "donor_sink_value", "redirect_sink_attention"])
    res = intervene(model.backbone(), x[:128], None, x[128:], st, progress=False)
    main = _by_class(res.rows, 2)["blocks 1..L-1"]["broadcast"]
    assert main["zero_sink_value"]["coherence"] > 0.8
    assert main["donor_sink_value"]["donor_cosine"] >= 0.9


def test_named_heads_without_events_and_bad_heads_are_refused() -> None:
    _, subject, x, d = _setup(with_events=False)
    for heads, message in ((["1:0"], "no sink events"), (["1:2"], "head 2 is out of range"),
                           (["5:0"], "block 5 is out of range"), (["x"], "not block:head")):
        with pytest.raises(ValueError, match=message):
            intervene(subject, x, None, x[:0], InterveneConfig(heads=heads, edits=["zero_sink_value"]), stage1=d,
                      progress=False)
    with pytest.raises(NoSinkHeads):  # automatic selection finds nothing and no whole-model edit was asked for
        intervene(subject, x, None, x[:0], InterveneConfig(edits=["zero_sink_value"]), stage1=d, progress=False)


def test_a_model_with_non_finite_weights_is_refused_not_measured() -> None:
    model, subject, x, d = _setup()
    with torch.no_grad():
        model.blocks[2].attn.proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="not finite"):
        intervene(subject, x, None, x[:0], InterveneConfig(heads=["1:0"], edits=["zero_sink_value"]), stage1=d,
                  progress=False)


def _ranked_fields(model: torch.nn.Module, x: torch.Tensor) -> dict[str, np.ndarray]:
    """Stage-1 fields of the tiny ViT with NOP event counts 4 (2:1) > 3 (1:0) > 2 (2:0) > 1 (0:1) (ranked order
    is not the sorted order) at the model's real sinks."""
    d = {"routed_frac": np.zeros((4, 3, 2)), "min_a": np.zeros((4, 3, 2)), "ratio_out": np.zeros((4, 3, 2)),
         "stable_rank": np.ones((4, 3, 2)), "sink_idx": _sinks(model, x)}
    for (b, h), n in {(2, 1): 4, (1, 0): 3, (2, 0): 2, (0, 1): 1}.items():
        d["routed_frac"][:n, b, h] = 1.0
    return d


def _replay_draws(seed: int, shard: int, batches: list[tuple[int, int]], heads: list[tuple[int, int]],
                  sinks: np.ndarray, n_tokens: int, num_prefix: int) -> dict[tuple[int, int, int], tuple[int, int]]:
    """The stated protocol, replayed: one generator seeded seed + 1000 * shard; per batch, per head in sorted order,
    a uniform patch per image for its own tokens, then one for its donor's (the next image of the batch), each
    moved to the next patch (cyclically) when it hits the excluded sink. {(image, block, head): (own, donor)}"""
    gen = torch.Generator().manual_seed(seed + 1000 * shard)
    n_patch = n_tokens - num_prefix
    out = {}
    for lo, hi in batches:
        for b, h in sorted(heads):
            s = sinks[lo:hi, b, h]
            drawn = []
            for excl in (s, np.roll(s, -1)):
                r = torch.randint(0, n_patch, (hi - lo,), generator=gen).numpy()
                drawn.append(np.where(num_prefix + r == excl, num_prefix + (r + 1) % n_patch, num_prefix + r))
            for i in range(hi - lo):
                out[(lo + i, b, h)] = (int(drawn[0][i]), int(drawn[1][i]))
    return out


def test_shards_run_the_sorted_heads_and_rows_name_their_images_donors_and_draws() -> None:
    model, subject, x, _ = _setup()
    x = torch.cat([x, torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))])
    d = _ranked_fields(model, x[:4])
    d = {k: np.concatenate([v, v[:2]]) for k, v in d.items()}
    d["sink_idx"] = _sinks(model, x)
    split = [40, 7, 13, 2, 31, 8]  # the images' indices in their split
    edits = ["donor_sink_value", "donor_nonsink_value", "zero_random_nonsink_value", "zero_sink_value"]
    ranked = select_heads(d, SinkRules(), 1, 16, 4)
    assert ranked != sorted(ranked)
    for shard in (0, 1):
        st = InterveneConfig(n_images=6, min_events=1, edits=edits, batch_size=3, seed=4, shard=shard, nshards=2)
        res = intervene(subject, x, None, x[:0], st, stage1=d, progress=False, index=split)
        assert res.heads == sorted(ranked)[shard::2] and res.selected == sorted(ranked)
        draws = _replay_draws(4, shard, [(0, 3), (3, 6)], res.heads, d["sink_idx"], 19, 3)
        for r in res.rows:
            lo = r["image"] // 3 * 3
            assert r["image_index"] == split[r["image"]]
            assert r["donor_index"] == (split[lo + (r["image"] - lo + 1) % 3] if r["edit"].startswith("donor")
                                        else -1)
            own, donor = draws[(r["image"], r["block"], r["head"])]
            assert r["random_token"] == {"zero_random_nonsink_value": own, "donor_nonsink_value": donor}.get(
                r["edit"], -1)
    with pytest.raises(ValueError, match="also edited"):
        intervene(subject, x[:4], None, x[4:], InterveneConfig(n_images=4, heldout_images=2, heads=["1:0"]),
                  stage1=_ranked_fields(model, x[:4]), progress=False, index=[1, 2, 3, 4], heldout_index=[4, 5])


def test_a_recorded_random_patch_is_the_one_edited() -> None:
    """zero_random_nonsink_value of image b at its recorded `random_token` j equals the model's own forward with
    head 1:1's contribution through j, A_:j v_j (gated), removed."""
    model, subject, x, d = _setup()
    st = InterveneConfig(n_images=4, heads=["1:1"], edits=["zero_random_nonsink_value"], batch_size=4, seed=9)
    res = intervene(subject, x, None, x[:0], st, stage1=d, progress=False)
    j = torch.tensor([r["random_token"] for r in res.rows])
    sinks = [r["sink_idx"] for r in res.rows]
    assert ((j >= 3) & (j != torch.tensor(sinks))).all()
    base, expected = _without_token(model, x, 1, 1, j)
    ours = [r["final_patch_relrms"] for r in res.rows]
    assert np.allclose(ours, hand_relrms(base, expected, sinks), rtol=1e-4, atol=1e-7) and min(ours) > 0


def test_a_head_without_held_out_events_gets_no_mean_sink_value_and_the_report_says_so(tmp_path: Path) -> None:
    model = cls_sink_vit()
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    subject = adapt(model.eval())
    live = SinkRules().event_class(stage_one(subject, x[4:], 4))  # the held-out images' live events
    assert (live[:, 0, 0] != "none").all() and (live[:, 0, 1] == "none").all()  # 0:0 by construction; 0:1 none
    d = stage_one(subject, x[:4], 4)
    d["routed_frac"][:, 0, 1] = 1.0  # 0:1 "has" events on the edited images, so it can be named
    st = InterveneConfig(n_images=4, heldout_images=4, heads=["0:0", "0:1"], batch_size=4)
    res = intervene(subject, x[:4], None, x[4:], st, stage1=d, progress=False)
    assert res.mean_skipped == {"0:1": "no sink event on a token among the 4 held-out images"}
    assert res.mean_source == {"0:0": "4 held-out events"}
    mean_rows = [(r["block"], r["head"]) for r in res.rows if r["edit"] == "mean_sink_value"]
    assert mean_rows == [(0, 0)] * 4 and {(r["block"], r["head"]) for r in res.rows} == {(0, 0), (0, 1)}
    meta = {"subject": "cls sink", "n_images": 4, "n_blocks": 2, "selected": ["0:0", "0:1"], "edits": res.edits,
            "min_class_events": 1, "mean_sink_value_skipped": res.mean_skipped, "checks": res.checks.as_dict()}
    text = to_markdown(write_outputs(tmp_path, res.rows, meta))
    assert "mean_sink_value skipped for heads 0:1 (no sink event on a token among the 4 held-out images)" in text
    with pytest.raises(ValueError, match="no head of this shard .0:1. has a sink event among the 4 held-out"):
        intervene(subject, x[:4], None, x[4:], InterveneConfig(n_images=4, heldout_images=4, heads=["0:1"],
                  edits=["mean_sink_value"]), stage1=d, progress=False)
