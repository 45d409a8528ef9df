"""VECA's cores (`model.cores.n`): the core-periphery mask against a matrix written by hand, information between
patches only through the cores (a planted change of one patch's input leaves every other patch's block output bit for
bit), the cores in the register slots of the layout, a sink planted on a core diagnosed and intervened on, and a run
of `exp=cores` from the command line to the leaderboard."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.commands import launch, one_line_error, run_module
from tests.helpers.tiny import TINY, images, tiny_vit
from vitsinks.backbones import adapt
from vitsinks.backbones.native import add_register
from vitsinks.configs.schema import DiagnosticsConfig, InterveneConfig, load_config
from vitsinks.diagnostics import run_diagnostics
from vitsinks.interventions import intervene
from vitsinks.interventions.edits import resolve_edits
from vitsinks.models import MITIGATIONS, SinkViT, model_from_config
from vitsinks.models.config import run_variant
from vitsinks.models.layout import KeyLayout
from vitsinks.models.mitigations.cores import CoreMask
from vitsinks.models.weights import architecture
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import PER_IMAGE

N_CORES = 3
HUBS = 1 + N_CORES  # [CLS] and the cores
PATCHES = 16  # the tiny ViT's


def cores_vit(n: int = N_CORES, **overrides: object) -> SinkViT:
    """The tiny ViT with `n` cores, seeded, in evaluation mode."""
    torch.manual_seed(0)
    return tiny_vit(cores={"n": n}, **overrides).eval()


def test_the_mask_is_the_core_periphery_pattern_written_by_hand() -> None:
    # [CLS], 2 cores, 3 patches, then 1 extra key slot: x marks a key the row's query may not see
    by_hand = [".......",  # [CLS]: everything
               ".......",  # core 1
               ".......",  # core 2
               "...xxx.",  # patch 1: [CLS], the cores and the extra slot; no patch, not itself
               "...xxx.",
               "...xxx."]
    expected = torch.tensor([[c == "x" for c in row] for row in by_hand])
    got = CoreMask(2).hidden(6, 7, torch.device("cpu"))
    assert got.dtype == torch.bool and torch.equal(got, expected)
    assert not CoreMask(2).hidden(3, 3, torch.device("cpu")).any()  # hubs only: nothing hidden


def test_a_patch_hears_another_patch_only_through_the_cores() -> None:
    """Block 0: changing patch p's input leaves patch q's output bit for bit (their only path, a core, is one block
    away); changing a core's input changes it. Two blocks carry p's change to q through the cores."""
    model = cores_vit()
    x = model.embed_tokens(images(2))
    p, q = HUBS + 2, HUBS + 9
    blk0 = model.blocks[0]
    with torch.no_grad():
        base = blk0(x)
        moved = x.clone()
        moved[:, p] += torch.randn(x.shape[-1], generator=torch.Generator().manual_seed(1))
        out = blk0(moved)
        assert torch.equal(out[:, q], base[:, q])
        others = [i for i in range(HUBS, HUBS + PATCHES) if i != p]
        assert torch.equal(out[:, others], base[:, others])  # every other patch too
        assert not torch.allclose(out[:, p], base[:, p])  # p itself changed ...
        assert not torch.allclose(out[:, 1:HUBS], base[:, 1:HUBS])  # ... and the cores heard it
        core = x.clone()
        # a random direction (the pre-norm removes a shift along the all-ones vector)
        core[:, 1] += torch.randn(x.shape[-1], generator=torch.Generator().manual_seed(2))
        assert not torch.allclose(blk0(core)[:, q], base[:, q])  # a core's input reaches every patch
        two = model.blocks[1](out)  # block 1: from the cores that heard p, to q
        assert not torch.allclose(two[:, q], model.blocks[1](base)[:, q])


def test_patch_rows_put_no_weight_on_patches_and_sum_to_one_over_the_hubs() -> None:
    model = cores_vit()
    x = model.embed_tokens(images(2))
    it = model.blocks[0].attn.internals(model.blocks[0].norm1(x))
    a = it.attn.detach()
    assert a.shape[-2:] == (HUBS + PATCHES, HUBS + PATCHES)
    assert (a[..., HUBS:, HUBS:] == 0).all()  # exactly zero on every patch, its own key included
    torch.testing.assert_close(a[..., HUBS:, :HUBS].sum(-1), torch.ones(2, 3, PATCHES))
    assert (a[..., :HUBS, HUBS:] > 0).all()  # the hubs see every patch


def test_the_cores_sit_in_the_register_slots_with_their_own_init_and_name() -> None:
    model = cores_vit(4)
    assert model.num_reg_tokens == 4 and model.key_layout() == KeyLayout(4, PATCHES)
    assert model.pos_embed.shape[1] == 1 + PATCHES  # no position embedding on the cores
    assert abs(float(model.reg_token.detach().std()) - 48**-0.5) < 0.05  # the authors' randn / sqrt(dim)
    wide = cores_vit(4, prefix_init_std=0.5).reg_token.detach()
    assert float(wide.std()) > 0.3  # model.prefix_init_std still sets them
    assert model.variant == "cores" and cores_vit(8).variant == "cores8"
    assert architecture(model.state_dict())["cores"] and architecture(model.state_dict())["registers"] == 4
    cfg = load_config(["exp=cores", *[o for o in TINY if o.startswith("model")]])
    assert run_variant(cfg) == "cores" and model_from_config(cfg.model).variant == "cores"
    assert run_variant(load_config(["exp=cores", "model.cores.n=2"])) == "cores2"
    assert run_variant(load_config(["exp=cores", "model.attn=softpick"])) == "softpick+cores"
    assert MITIGATIONS["cores"].setting(0) is None and MITIGATIONS["cores"].setting({"n": 0}) is None


@pytest.mark.parametrize("value, said", [(-1, "model.cores.n must be a whole number >= 0"),
                                         ({"m": 2}, "unknown cores settings ['m']"),
                                         (1.5, "model.cores.n must be a whole number >= 0")])
def test_a_bad_core_count_is_one_line(value: object, said: str) -> None:
    with pytest.raises(BadValue, match=said.replace("[", r"\[").replace("]", r"\]")):
        MITIGATIONS["cores"].setting(value)


def test_cores_and_registers_do_not_stack() -> None:
    with pytest.raises(BadValue, match=r"model.cores puts its learned tokens in the register slots and "
                                       r"model.registers=2 does not stack with it: set model.registers=0"):
        tiny_vit(cores={"n": 2}, registers=2)


def test_a_cores_model_is_diagnosed_from_the_computation_it_runs(tmp_path: Path) -> None:
    model = cores_vit()
    x = images(4)
    summary = run_diagnostics(model, x, np.zeros((4, 32, 32, 3), np.uint8), tmp_path,
                              DiagnosticsConfig(plots=False, report=False))
    assert summary["recompute_error_max"] < 1e-5  # the block rebuilt from (A, v) is the model's own forward
    d = dict(np.load(tmp_path / PER_IMAGE))
    assert KeyLayout.from_fields(d) == KeyLayout(N_CORES, PATCHES)
    assert set(summary["location_by_block"]) == {"cls", "register", "patch"}


def core_sink_vit() -> SinkViT:
    """`cores_vit` whose block 1, head 0 is a sink on core 1 (key 1): every query (patches too: they see the cores)
    scores that key ~100 nats above the others, through a marker channel only core 1 carries."""
    model, channel, gain = cores_vit(), 5, 10.0
    attn = model.blocks[1].attn
    dim, hd = attn.qkv.in_features, attn.head_dim
    u = torch.nn.functional.normalize(torch.randn(hd, generator=torch.Generator().manual_seed(0)), dim=0)
    with torch.no_grad():
        for w in (model.patch_embed.proj.weight, model.patch_embed.proj.bias, model.pos_embed[0].T,
                  model.cls_token[0].T, model.reg_token[0].T):
            w[channel] = 0.0
        model.reg_token[0, 0, channel] = 50.0
        w, b = attn.qkv.weight, attn.qkv.bias
        w[:hd], b[:hd] = 0.0, u / attn.scale  # head 0's query: u / scale for every token
        w[dim : dim + hd], b[dim : dim + hd] = gain * torch.outer(u, torch.eye(dim)[channel]), 0.0
    return model


def test_a_sink_planted_on_a_core_is_found_located_as_a_register_and_edited(tmp_path: Path) -> None:
    model = core_sink_vit()
    summary = run_diagnostics(model, images(4), np.zeros((4, 32, 32, 3), np.uint8), tmp_path,
                              DiagnosticsConfig(plots=False, report=False))
    d = dict(np.load(tmp_path / PER_IMAGE))
    assert (d["sink_idx"][:, 1, 0] == 1).all() and (d["mass"][:, 1, 0] > 0.5).all()
    assert summary["location_by_block"]["register"][1] >= 1.0
    x = images(8)
    res = intervene(adapt(model), x[:4], None, x[4:], InterveneConfig(n_images=4, heldout_images=4, batch_size=4,
                                                                      heads=["1:0"]), progress=False)
    on_head = [r for r in res.rows if (r["block"], r["head"]) == (1, 0)]
    assert on_head and {(r["sink_idx"], r["sink_loc"]) for r in on_head} == {(1, "register")}
    assert {r["edit"] for r in res.rows} == set(res.edits)
    assert "drop_registers" not in res.edits and "zero_registers" in res.edits  # every default edit, with the checks


def test_a_test_time_register_on_a_cores_model_is_read_as_a_patch() -> None:
    model = cores_vit()
    grown = add_register(model, "test-time register")
    x = grown.backbone.embed_tokens(images(2))
    a = model.blocks[0].attn.internals(model.blocks[0].norm1(x)).attn.detach()
    reg = HUBS  # right after the cores
    assert a.shape[-1] == HUBS + 1 + PATCHES and model.variant == "cores3 + test-time register"
    assert (a[..., reg, reg:] == 0).all() and (a[..., reg + 1 :, reg] == 0).all()  # no patch sees it, nor it them
    assert (a[..., :HUBS, reg] > 0).all()  # the hubs do


def test_dropping_the_cores_is_refused_and_left_out_of_the_default_edits() -> None:
    subject = adapt(cores_vit())
    assert subject.mitigations == ("cores",) and subject.num_registers == N_CORES
    edits = resolve_edits([], subject.mitigations, subject.num_registers, subject.attn_kinds)
    assert "drop_registers" not in edits and "zero_registers" in edits
    with pytest.raises(BadValue, match="edit drop_registers does not apply to a model with the cores mitigation"):
        resolve_edits(["drop_registers"], subject.mitigations, subject.num_registers)


def test_cores_with_registers_stop_launch_in_one_line(tmp_path: Path) -> None:
    line = one_line_error(launch("exp=cores", "model.registers=2", *TINY, f"runs_dir={tmp_path}"))
    assert "model.registers=2 does not stack with it: set model.registers=0" in line


@pytest.mark.slow
def test_exp_cores_trains_diagnoses_probes_and_reaches_the_leaderboard(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    done = launch("exp=cores", *TINY, f"runs_dir={runs}", "name=cores-tiny", "train.max_steps=2",
                  "eval.after_train=true", "eval.max_train_images=32", "eval.max_val_images=8",
                  "eval.linear_epochs=1", "eval.linear_lrs=[0.01]", "eval.dense_epochs=1",
                  "diagnostics.n_images=4", "diagnostics.plots=false", "diagnostics.report=false")
    assert done.returncode == 0, done.stderr[-3000:]
    run = runs / "cores-tiny"
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
    summary = json.loads((run / "diagnostics" / "final" / "summary.json").read_text())
    assert summary["recompute_error_max"] < 1e-4 and "register" in summary["location_by_block"]
    assert json.loads((run / "results" / "linear.json").read_text())["best"]["top1"] >= 0
    board = run_module("vitsinks.leaderboard", f"runs={runs}")
    assert board.returncode == 0, board.stderr[-3000:]
    assert "| cores | 1 |" in board.stdout, board.stdout  # its row: the variant, one seed
