"""The transformers adapter (small random configs, no hub): views of `Dinov2Model`, `Dinov2WithRegistersModel`,
`ViTModel`, `CLIPVisionModel` and `SiglipVisionModel` reproduce the model, give transformers' own (eager) attention
probabilities and a float64 recomputation's, and, where the architecture is vitsinks' own, the same diagnostics as
vitsinks' ViT on the converted weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.adapter_checks import assert_fields_equal_own, assert_fields_match_attention, zeroed_value_relrms
from tests.helpers.requirements import require
from tests.helpers.transformers_models import REGISTERS, SMALL, build, images
from vitsinks.backbones.transformers_vit import SPECS
from vitsinks.diagnostics.core import diagnose_tokens
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.diagnostics.summary import summarize
from vitsinks.models import SinkViT, load_timm_state_dict
from vitsinks.models.layout import KeyLayout
from vitsinks.pretrained import adapt, diagnose, diagnose_fields, intervene, report
from vitsinks.utils.errors import BadValue

T = require("transformers")

MODELS = ("dinov2", "dinov2_reg", "vit", "clip", "siglip")


@pytest.mark.parametrize("name", MODELS)
@torch.no_grad()
def test_views_reproduce_the_model(name: str) -> None:
    m = build(name)
    f, x = adapt(m), images()
    assert f.family == "transformers" and type(m).__name__ in SPECS
    assert (f.num_cls, f.num_registers) == ((0, 0) if name == "siglip" else (1, REGISTERS * (name == "dinov2_reg")))
    t = f.embed(x)
    for blk in f.blocks:
        out, _ = blk.forward_explicit(t)
        t = blk(t)
        assert (out - t).abs().max() <= 1e-5 * t.abs().max()
    got = m(pixel_values=x)
    if name == "clip":  # transformers norms the pooled [CLS] only
        torch.testing.assert_close(t, got.last_hidden_state, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(f.readout(t)[:, 0], got.pooler_output, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(f.readout(t), got.last_hidden_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
@torch.no_grad()
def test_attention_equals_transformers_eager(name: str) -> None:
    m = build(name)
    f, x = adapt(m), images()
    m.set_attn_implementation("eager")
    want = m(pixel_values=x, output_attentions=True).attentions
    t = f.embed(x)
    for blk, a in zip(f.blocks, want, strict=True):
        torch.testing.assert_close(blk.attn.internals(blk.norm1(t)).attn, a, rtol=1e-5, atol=1e-6)
        t = blk(t)


@torch.no_grad()
def test_attention_equals_a_float64_recomputation() -> None:
    m = build("siglip")  # no [CLS]
    f, x = adapt(m), images()
    t = f.blocks[0](f.embed(x))
    layer = m.encoder.layers[1]
    d = {k: v.double() for k, v in layer.state_dict().items()}
    z = F.layer_norm(t.double(), (t.shape[-1],), d["layer_norm1.weight"], d["layer_norm1.bias"],
                     layer.layer_norm1.eps)
    B, N, _ = z.shape
    q, k = ((z @ d[f"self_attn.{p}.weight"].T + d[f"self_attn.{p}.bias"]).view(B, N, 2, -1).transpose(1, 2)
            for p in ("q_proj", "k_proj"))
    ref = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).softmax(-1)
    it = f.blocks[1].attn.internals(f.blocks[1].norm1(t))
    assert (it.attn.double() - ref).abs().max() < 1e-5
    assert_fields_match_attention(diagnose_tokens(f.blocks[1:], t, num_prefix=f.num_prefix), ref, f.num_prefix)


def timm_state_dict(m: nn.Module) -> dict[str, torch.Tensor]:
    """A DINOv2 / ViT model of transformers as a timm `VisionTransformer` state dict."""
    sd, spec = m.state_dict(), SPECS[type(m).__name__]
    e = "embeddings."
    out = {"cls_token": sd[e + "cls_token"], "pos_embed": sd[e + "position_embeddings"],
           "patch_embed.proj.weight": sd[e + "patch_embeddings.projection.weight"],
           "patch_embed.proj.bias": sd[e + "patch_embeddings.projection.bias"],
           "norm.weight": sd[spec.readout + ".weight"], "norm.bias": sd[spec.readout + ".bias"]}
    if e + "register_tokens" in sd:
        out["reg_token"] = sd[e + "register_tokens"]
    for i in range(m.config.num_hidden_layers):
        h, t = f"{spec.layers}.{i}.", f"blocks.{i}."
        for w in ("weight", "bias"):
            out[t + f"attn.qkv.{w}"] = torch.cat([sd[h + f"{spec.attn}.{p}_proj.{w}"] for p in "qkv"])
            out[t + f"attn.proj.{w}"] = sd[h + f"{spec.attn}.o_proj.{w}"]
            out[t + f"norm1.{w}"], out[t + f"norm2.{w}"] = sd[h + f"{spec.norm1}.{w}"], sd[h + f"{spec.norm2}.{w}"]
            out[t + f"mlp.fc1.{w}"], out[t + f"mlp.fc2.{w}"] = sd[h + f"mlp.fc1.{w}"], sd[h + f"mlp.fc2.{w}"]
        if spec.ls1:
            out[t + "ls1.gamma"], out[t + "ls2.gamma"] = sd[h + f"{spec.ls1}.lambda1"], sd[h + f"{spec.ls2}.lambda1"]
    return out


@pytest.mark.parametrize("name", ("dinov2", "dinov2_reg", "vit"))
@torch.no_grad()
def test_fields_equal_vitsinks_own_implementation(name: str) -> None:
    m = build(name)
    c = m.config
    own = SinkViT(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, qkv_bias=True,
                  num_classes=0, reg_tokens=getattr(c, "num_register_tokens", 0),
                  init_values=1.0 if name != "vit" else None, norm_eps=c.layer_norm_eps).eval()
    load_timm_state_dict(own, timm_state_dict(m))
    f, x = adapt(m), images()
    assert_fields_equal_own(f, own, x)


@torch.no_grad()
def test_diagnose_wrapped_and_without_cls() -> None:
    clip = T.CLIPModel(T.CLIPConfig(vision_config={**SMALL, "intermediate_size": 64},
                                    text_config={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                                 "intermediate_size": 64})).eval()
    f = adapt(clip)
    assert f.num_cls == 1 and len(f.blocks) == 2
    classifier = T.Dinov2ForImageClassification(T.Dinov2Config(**SMALL, mlp_ratio=2, num_labels=3)).eval()
    assert adapt(classifier).blocks[0].block is classifier.dinov2.encoder.layer[0]
    tabs = diagnose(build("siglip"), images(2))
    assert int(tabs["layout"]["num_prefix"][0]) == 0 and set(tabs["heads"]["sink_location"]) == {"patch"}
    assert tabs["checks"]["recompute_error"].max() < 1e-4


SINK_CHANNEL = 5


def plant_head0(attn: nn.Module, hd: int, channel: int) -> None:
    """Head 0 of `attn` (separate q_proj / k_proj Linears) sends every query to the key massive in `channel`: its
    queries are one fixed unit vector u, its keys read `channel` alone along u."""
    u = torch.randn(hd, generator=torch.Generator().manual_seed(2))
    u = u / u.norm()
    attn.q_proj.weight[:hd] = 0
    attn.q_proj.bias[:hd] = 3 * u
    attn.k_proj.weight[:hd] = 0
    attn.k_proj.weight[:hd, channel] = 10 * u
    attn.k_proj.bias[:hd] = 0


def test_intervene_on_a_planted_register_sink() -> None:
    """Head 0 of layer 1 of a DINOv2 with registers attends to register 2 (massive in one channel) from every query;
    the interventions run through the views, LayerScale included."""
    m = build("dinov2_reg")
    with torch.no_grad():
        plant_head0(m.encoder.layer[1].attention, 16, SINK_CHANNEL)
        m.embeddings.register_tokens[0, 2, SINK_CHANNEL] = 50.0
    x = images(6)
    got = intervene(m, x[:4], heads=[(1, 0)], edits=["zero_sink_value", "redirect_sink_attention", "drop_registers"],
                    heldout=x[4:], batch_size=4)
    rows = got["rows"]
    on_head = [i for i, e in enumerate(rows["edit"]) if e != "drop_registers"]
    assert {rows["sink_idx"][i] for i in on_head} == {1 + 2} and {rows["sink_loc"][i] for i in on_head} == {"register"}
    assert rows["edit"].count("drop_registers") == 4
    assert float(got["checks"]["recompute_error_max"]) < 1e-4 and got["checks"]["redirect_rows_checked"] > 0


def planted_siglip() -> nn.Module:
    """The small SigLIP (no [CLS], no registers) whose head 0 of layer 1 attends to key 0, the first patch, from every
    query: that patch is massive in one channel (its position embedding), which head 0's keys read alone."""
    m = build("siglip")
    with torch.no_grad():
        plant_head0(m.encoder.layers[1].self_attn, SMALL["hidden_size"] // SMALL["num_attention_heads"], SINK_CHANNEL)
        m.embeddings.position_embedding.weight[0, SINK_CHANNEL] = 50.0
    return m


def siglip_zeroed_value_relrms(m: nn.Module, x: torch.Tensor, layer: int, head: int, key: int) -> np.ndarray:
    """Per image: the relative RMS change of transformers' own final tokens (`last_hidden_state`) over the patches
    but `key`, when head `head` of layer `layer` gets a zero value at `key` by a hook on its `v_proj` (float64)."""
    v_proj, hd = m.encoder.layers[layer].self_attn.v_proj, SMALL["hidden_size"] // SMALL["num_attention_heads"]
    keep = [j for j in range((SMALL["image_size"] // SMALL["patch_size"]) ** 2) if j != key]
    return zeroed_value_relrms(lambda: m(pixel_values=x).last_hidden_state, v_proj, key,
                               slice(head * hd, (head + 1) * hd), keep)


def test_a_patch_sink_of_siglip_is_diagnosed_and_intervened_on() -> None:
    """Without a [CLS], key 0 is a patch: `diagnose` places the planted sink there, and zeroing its value through
    the views moves the final patches exactly as transformers' own forward with a hook on `v_proj` does."""
    m, x = planted_siglip(), images(6)
    heads = diagnose(m, x[:4])["heads"]
    planted = (heads["block"] == 1) & (heads["head"] == 0)
    assert (heads["routed_frac"][planted] > 0.99).all() and set(heads["sink_idx"][planted]) == {0}
    assert set(heads["sink_location"][planted]) == {"patch"} and "cls" not in set(heads["sink_location"])
    got = intervene(m, x[:4], heads=[(1, 0)], edits=["zero_sink_value"], batch_size=4)
    rows = got["rows"]
    assert rows["edit"] == ["zero_sink_value"] * 4 and set(rows["sink_loc"]) == {"patch"}
    assert set(rows["sink_idx"]) == {0} and "probe_agree" not in rows  # transformers' heads are not read
    want = siglip_zeroed_value_relrms(m, x[:4], 1, 0, 0)
    assert want.min() > 1e-3  # the edit moves the patches: the comparison is not 0 against 0
    np.testing.assert_allclose(rows["final_patch_relrms"], want, rtol=1e-4)
    assert float(got["checks"]["recompute_error_max"]) < 1e-4


def test_every_edit_that_applies_runs_without_cls() -> None:
    """The default edits of a model without [CLS] or registers: every head edit, no register edit; the random
    control draws patches other than the sink, key 0 included among the candidates."""
    m, x = planted_siglip(), images(6)
    got = intervene(m, x[:4], heads=[(1, 0)], heldout=x[4:], batch_size=4)
    rows = got["rows"]
    assert set(rows["edit"]) == {"zero_sink_value", "mean_sink_value", "noise_sink_value", "donor_sink_value",
                                 "shuffle_sink_value", "donor_nonsink_value", "redirect_sink_attention",
                                 "zero_random_nonsink_value"}
    drawn = [t for e, t in zip(rows["edit"], rows["random_token"], strict=True) if e == "zero_random_nonsink_value"]
    assert all(0 < t < 16 for t in drawn)  # the sink is key 0; the 16 patches are keys 0..15
    with pytest.raises(BadValue, match="register tokens"):
        intervene(m, x[:4], heads=[(1, 0)], edits=["drop_registers"], batch_size=4)


def test_the_summary_of_siglip_counts_its_sinks_as_patches() -> None:
    """`diagnostics.summary.summarize` on SigLIP's fields: every event is on a patch (none on [CLS] or a register),
    the planted head's in layer 1, and the massive token (key 0) is a patch too."""
    m, x = planted_siglip(), images(4)
    d = diagnose_fields(m, x)
    assert int(d["num_cls"]) == 0 and KeyLayout.from_fields(d) == KeyLayout(0, 16, cls=0)
    rules = SinkRules()
    s = summarize(d, rules)
    ev = rules.events(d)
    assert ev[:, 1, 0].all() and (d["sink_idx"][:, 1, 0] == 0).all()
    assert s["location_by_block"]["patch"] == pytest.approx(ev.sum(2).mean(0).tolist())
    assert s["location_by_block"]["cls"] == [0.0, 0.0] and s["location_by_block"]["register"] == [0.0, 0.0]
    assert s["sinks_per_image"]["all"]["cls"] == 0.0 and s["sinks_per_image"]["all"]["patch"] > 0
    assert (d["massive_token"] == 0).all()
    assert s["massive_activations"]["location_share_by_block"]["patch"] == [1.0, 1.0]


def test_the_report_of_siglip_has_no_cls_share(tmp_path: Path) -> None:
    """`pretrained.report` (the CLI's files and page) on SigLIP: the page's maps give no [CLS] value, the sum of the
    patch map is the whole attention (no prefix), and the strongest head of layer 1 sits on a patch."""
    m, x = planted_siglip(), images(4)
    summary = report(m, x, tmp_path)
    assert summary["location_by_block"]["cls"] == [0.0, 0.0]
    page = json.loads((tmp_path / "report.json").read_text())
    assert page["strongest_head_by_block"]["location"][1] == "patch"
    for card in page["images"]:
        for a, t in zip(card["attention"], card["token_norm"], strict=True):
            assert a["cls"] is None and a["registers"] == [] and t["cls"] is None
            assert a["patches"] == pytest.approx(1.0, abs=1e-4)  # every key is a patch
