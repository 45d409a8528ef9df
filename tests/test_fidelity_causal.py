"""Fidelity of the causal edits to the reference's own code (KempnerInstitute/attention_sink a83cd59,
`vit_causal/interventions.py`), under `intervene.reference_formulas` (`selection=kempner_causal`): its redirect
formula (`redirect_sink_attention_ref`) and its donor cosine, each held against a transcription of the reference's
formula written here (never vitsinks' code), on a tiny softmax ViT with a planted patch sink; and vitsinks' defaults
(the exact redirect from the scores, the sink patch left out of the donor direction) measured against them."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers.strong_sink import final_patch_relrms_with
from tests.helpers.tiny import tiny_vit
from vitsinks.backbones import adapt
from vitsinks.configs.schema import InterveneConfig, load_config
from vitsinks.interventions import intervene
from vitsinks.interventions.edits import resolve_edits
from vitsinks.interventions.engine import patch_metrics
from vitsinks.interventions.report import to_markdown, write_outputs
from vitsinks.models import ATTN_KINDS, SinkViT
from vitsinks.utils.errors import BadValue

C, PIXEL = 5, 40.0  # the planted channel; the sink patch's marked pixel


def patch_sink_vit(gain: float) -> SinkViT:
    """A 2-block, 2-head tiny ViT whose head 0:0 scores the marked patch of an image (`marked_images`) about
    6.7 * `gain` nats above every other key: channel C of the tokens entering block 0 is the pixel at the top-left
    corner of channel 0 of each patch (no position embedding there, 0 at [CLS]), so it dominates the normed token of
    the marked patch (~6.8) and is small elsewhere; the head's keys are gain * z[C] u and its queries u (a little of
    the token added: the rows differ by a few %), its values 5x as initialised. Head 0:1 and block 1 as
    initialised."""
    torch.manual_seed(0)
    model = tiny_vit(num_heads=2).eval()
    attn, dim = model.blocks[0].attn, 48
    hd = attn.head_dim
    u = torch.randn(hd)
    u /= u.norm()
    with torch.no_grad():
        model.cls_token[..., C] = 0.0
        model.pos_embed[..., C] = 0.0
        model.patch_embed.proj.weight[C] = 0.0
        model.patch_embed.proj.weight[C, 0, 0, 0] = 1.0
        model.patch_embed.proj.bias[C] = 0.0
        w, b = attn.qkv.weight, attn.qkv.bias
        w[:hd] *= 0.05
        b[:hd] = u / attn.scale
        w[dim : dim + hd] = gain * torch.outer(u, torch.eye(dim)[C])
        b[dim : dim + hd] = 0.0
        w[2 * dim : 2 * dim + hd] *= 5.0  # a head whose output is felt (final patches move by ~10 %)
    return model


def marked_images(n: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """n 32 x 32 images in 8 px patches, each with one marked patch (a different one from the next image's); returns
    (images, the marked patch's token index)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 32, 32, generator=g)
    x[:, 0, ::8, ::8] = 0.0
    patch = torch.randperm(16, generator=g)[:n] if n <= 16 else torch.randint(0, 16, (n,), generator=g)
    for i, p in enumerate(patch.tolist()):
        x[i, 0, 8 * (p // 4), 8 * (p % 4)] = PIXEL
    return x, 1 + patch


def reference_redirect(a: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """vit_causal/interventions.py's redirect_sink_attention on one head's A (B, N, N), transcribed: column s set to
    0, each row divided by its sum clamped at 1e-12, in float32."""
    out = a.float().clone()
    out[torch.arange(len(a)), :, sink] = 0.0
    return out / out.sum(-1, keepdim=True).clamp_min(1e-12)


def _rows(res, edit: str, head: int = 0) -> list[dict]:
    return [r for r in res.rows if r["edit"] == edit and r["head"] == head and r["block"] == 0]


def _run(model: SinkViT, x: torch.Tensor, edits: list[str], reference: bool):
    st = InterveneConfig(n_images=len(x), heads=["0:0"], edits=edits, batch_size=len(x), reference_formulas=reference)
    return intervene(adapt(model.eval()), x, None, x[:0], st, progress=False)


@pytest.mark.parametrize("gain", [100.0, 5.0])
def test_the_reference_redirect_equals_its_transcription_on_a_strong_sink(gain: float) -> None:
    """gain 100: a ~670 nat lead, float32 A is exactly 0 off the sink (every row switched off); gain 5: ~33 nats,
    A holds ~1e-14 off the sink (every row below the clamp, so divided by 1e-12, not renormalised)."""
    model = patch_sink_vit(gain)
    x, marked = marked_images(8)
    res = _run(model, x, ["redirect_sink_attention", "redirect_sink_attention_ref"], reference=True)
    ref = _rows(res, "redirect_sink_attention_ref")
    sink = torch.tensor([r["sink_idx"] for r in ref])
    assert torch.equal(sink, marked) and len(ref) == 8
    with torch.no_grad():
        blk = model.blocks[0]
        a = blk.attn.internals(blk.norm1(model.embed_tokens(x))).attn[:, 0]
    off = a.clone()
    off[torch.arange(8), :, sink] = 0.0
    if gain > 50:
        assert not off.any()
    else:
        assert (off.sum(-1) > 0).all() and (off.sum(-1) < 1e-12).all()
    truth = final_patch_relrms_with(model, x, 0, 0, sink, torch.float32, reference_redirect)
    ours = np.array([r["final_patch_relrms"] for r in ref])
    assert np.abs(ours - truth).max() < 1e-6, np.abs(ours - truth).max()
    assert res.checks.redirect_ref_rows == res.checks.redirect_ref_rows_clamped == 8 * 17  # every row below the clamp
    exact = np.array([r["final_patch_relrms"] for r in _rows(res, "redirect_sink_attention")])
    assert (np.abs(exact - ours) / exact > 1e-3).all()  # switched off is not redirected


def test_on_a_weak_sink_both_redirects_agree() -> None:
    model = patch_sink_vit(0.5)  # a lead of ~3 nats: A holds a good share of every row off the sink
    x, marked = marked_images(8)
    res = _run(model, x, ["redirect_sink_attention", "redirect_sink_attention_ref"], reference=True)
    ref = _rows(res, "redirect_sink_attention_ref")
    sink = torch.tensor([r["sink_idx"] for r in ref])
    assert torch.equal(sink, marked)
    ours = np.array([r["final_patch_relrms"] for r in ref])
    exact = np.array([r["final_patch_relrms"] for r in _rows(res, "redirect_sink_attention")])
    truth = final_patch_relrms_with(model, x, 0, 0, sink, torch.float32, reference_redirect)
    assert np.abs(ours - truth).max() < 1e-6 and np.abs(ours - exact).max() < 1e-5
    assert ours.min() > 1e-2 and res.checks.redirect_ref_rows_clamped == 0


def _donor_finals(model: SinkViT, x: torch.Tensor, sink: torch.Tensor, source: list[tuple[int, int]]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(unedited, edited) final tokens with head 0:0's value at image b's sink replaced by v[source[b]] (image,
    token), the rest of the network run (as the reference's block_forward_from_AV + finish_forward)."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        t = m.embed_tokens(x)
        blk = m.blocks[0]
        it = blk.attn.internals(blk.norm1(t))
        v = it.v.clone()
        for b, (i, j) in enumerate(source):
            v[b, 0, int(sink[b])] = it.v[i, 0, j]
        edited = blk.from_heads(t, it.attn @ v, it.gate)
        for later in m.blocks[1:]:
            edited = later(edited)
        return m.norm(m.blocks(t)), m.norm(edited)


def reference_donor_cosine(base: torch.Tensor, edited: torch.Tensor, sink: torch.Tensor, donor: torch.Tensor,
                           all_patches: bool = True) -> np.ndarray:
    """vit_causal/interventions.py's donor_dir_cos_patch, transcribed (1 prefix token): the mean patch change over
    the patches but the sink, cosine (eps 1e-8) with (the donor's mean final patch - own) over ALL patches; with
    `all_patches` False the direction's means leave each image's sink patch out too (vitsinks' default)."""
    P, Pn = base[:, 1:].double(), edited[:, 1:].double()
    recip = torch.ones(P.shape[:2], dtype=torch.bool)
    recip[torch.arange(len(P)), sink - 1] = False
    m = recip.double().unsqueeze(-1)
    mean_dp = ((Pn - P) * m).sum(1) / m.sum(1)
    mean_p = P.mean(1) if all_patches else (P * m).sum(1) / m.sum(1)
    return F.cosine_similarity(mean_dp, mean_p[donor] - mean_p, dim=-1, eps=1e-8).numpy()


@pytest.mark.parametrize("edit", ["donor_sink_value", "donor_nonsink_value"])
def test_the_donor_cosine_under_the_reference_preset_equals_its_transcription(edit: str) -> None:
    model = patch_sink_vit(100.0)
    x, sink = marked_images(8)
    ref = _rows(_run(model, x, [edit], reference=True), edit)
    default = _rows(_run(model, x, [edit], reference=False), edit)
    donor = torch.roll(torch.arange(8), -1)
    token = [r["random_token"] for r in ref] if edit == "donor_nonsink_value" else sink[donor].tolist()
    assert [r["random_token"] for r in default] == [r["random_token"] for r in ref]  # the same draws
    base, edited = _donor_finals(model, x, sink, list(zip(donor.tolist(), token, strict=True)))
    ours = np.array([r["donor_cosine"] for r in ref])
    truth = reference_donor_cosine(base, edited, sink, donor)
    assert np.abs(ours - truth).max() < 1e-6, np.abs(ours - truth).max()
    mine = np.array([r["donor_cosine"] for r in default])
    assert np.abs(mine - reference_donor_cosine(base, edited, sink, donor, all_patches=False)).max() < 1e-6
    assert np.abs(mine - truth).max() > 1e-3  # the sink patch is far from negligible here
    for key in ("final_patch_relrms", "coherence"):  # nothing else moves with the flag
        assert [r[key] for r in ref] == [r[key] for r in default]


def reference_coherence(base: torch.Tensor, edited: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """vit_causal/common.py's shared_energy_fraction of dP = edited - base over the patches but the sink (1 prefix
    token), transcribed in the tokens' dtype (float32): ||mean dP||^2 * count / sum ||dP||^2, NaN only where no patch
    is left or that sum is <= 1e-20."""
    d = (edited - base)[:, 1:]
    m = torch.ones(d.shape[:2], dtype=d.dtype)
    rows = (sink >= 1).nonzero().squeeze(-1)
    m[rows, sink[rows] - 1] = 0.0
    cnt = m.sum(1)
    mean = (d * m.unsqueeze(-1)).sum(1) / cnt.clamp_min(1.0).unsqueeze(-1)
    total = (d.pow(2).sum(-1) * m).sum(1)
    frac = mean.pow(2).sum(-1) * cnt / total.clamp_min(1e-20)
    return torch.where((cnt == 0) | (total <= 1e-20), torch.full_like(frac, float("nan")), frac)


def test_the_coherence_is_nan_only_where_the_references_is() -> None:
    """Changes of every size against the transcription: a real one, one of a few float32 ulps (a NOP edit's: rel.
    RMS ~1e-8, where vitsinks once said NaN and the reference gives a number), none, and changes just above and
    below the reference's 1e-20 energy."""
    torch.manual_seed(0)
    base = torch.randn(4, 17, 48)
    sink = torch.tensor([0, 3, 16, 5])  # on [CLS] (every patch kept), on patches
    ulps = base.clone()
    ulps[:, 1:, :3] = torch.nextafter(base[:, 1:, :3], torch.full_like(base[:, 1:, :3], 10.0))
    small = 1e-12 * torch.randn(4, 17, 48)
    cases = {"real": (base, base + 0.1 * torch.randn(4, 17, 48)), "ulps": (base, ulps), "none": (base, base.clone()),
             "above 1e-20": (small, small + 1e-11 * torch.randn(4, 17, 48)),  # ~8e-20
             "below 1e-20": (small, small + 1e-13 * torch.randn(4, 17, 48))}
    for name, (b, e) in cases.items():
        want = reference_coherence(b, e, sink)
        got = patch_metrics(b, e, num_prefix=1, sink=sink)
        assert torch.equal(torch.isnan(got["coherence"]), torch.isnan(want)), (name, got["coherence"], want)
        ok = ~torch.isnan(want)
        torch.testing.assert_close(got["coherence"][ok].float(), want[ok], rtol=1e-5, atol=0, msg=name)
        if name == "ulps":
            assert ok.all() and (got["final_patch_relrms"] < 1e-6).all()  # below the old floor, still a number
        if name in ("none", "below 1e-20"):
            assert not ok.any()
        if name in ("real", "above 1e-20"):
            assert ok.all()


def test_the_reference_redirect_runs_by_default_only_under_the_preset_and_only_for_softmax() -> None:
    assert load_config(["selection=kempner_causal"]).intervene.reference_formulas is True
    assert load_config([]).intervene.reference_formulas is False
    assert "redirect_sink_attention_ref" not in resolve_edits([], (), 0)
    assert "redirect_sink_attention_ref" in resolve_edits([], (), 0, ("softmax",), reference=True)
    assert "redirect_sink_attention_ref" not in resolve_edits([], (), 0, ("relu",), reference=True)
    assert resolve_edits(["redirect_sink_attention_ref"], (), 0) == ["redirect_sink_attention_ref"]
    for kind in (k for k in ATTN_KINDS if k != "softmax"):  # every other kind
        with pytest.raises(BadValue, match=f"softmax attention .*this model's attention is {kind}") as err:
            resolve_edits(["redirect_sink_attention_ref"], (), 0, (kind,), reference=True)
        assert "\n" not in str(err.value)
    with pytest.raises(BadValue, match="use redirect_sink_attention"):
        intervene(adapt(tiny_vit(attn="relu").eval()), torch.zeros(2, 3, 32, 32), None, torch.zeros(0, 3, 32, 32),
                  InterveneConfig(n_images=2, heads=["0:0"], edits=["redirect_sink_attention_ref"]), progress=False)


def test_the_report_shows_both_redirects_the_clamped_rows_and_the_donor_cosine_form(tmp_path) -> None:
    model = patch_sink_vit(100.0)
    x, _ = marked_images(8)
    for reference, form in ((True, "all patches (the reference's)"), (False, "sink patch left out")):
        res = _run(model, x, ["donor_sink_value", "redirect_sink_attention", "redirect_sink_attention_ref"],
                   reference)
        assert res.donor_cosine_form == form
        summary = write_outputs(tmp_path / str(reference), res.rows, {
            "subject": "planted", "n_images": 8, "n_blocks": 2, "selected": ["0:0"], "edits": res.edits,
            "donor_cosine_form": res.donor_cosine_form, "min_class_events": 1, "checks": res.checks.as_dict()})
        cells = next(iter(summary["by_class"].values()))
        cells = next(iter(cells.values()))
        assert {"redirect_sink_attention", "redirect_sink_attention_ref"} <= set(cells)
        md = to_markdown(summary)
        assert f"its means over the patches: {form}." in md
        assert "redirect_sink_attention_ref (the reference's formula" in md and "136 of 136 rows" in md
