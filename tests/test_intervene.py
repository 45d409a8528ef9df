"""`python -m vitsinks.intervene` on checkpoints of the ViT sink tasks trained by the real pipeline: the theory's
predictions, the outputs, reused diagnostics, shards and their merge, the leaderboard's causal column, bad input."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from tests.helpers.commands import run_command
from tests.helpers.figures import bar_heights
from tests.helpers.strong_sink import final_patch_relrms_with, rescaled
from tests.helpers.tiny import TINY, tiny_cfg, tiny_vit
from vitsinks.configs.schema import load_config
from vitsinks.data import build_dataset
from vitsinks.data.selection import permutation
from vitsinks.intervene import run
from vitsinks.interventions import report
from vitsinks.interventions.edits import EDITS
from vitsinks.interventions.report import merge
from vitsinks.report import collect
from vitsinks.run.diagnosed import diagnose_checkpoint
from vitsinks.run.imported import imported_run
from vitsinks.run.source import resolve
from vitsinks.train.checkpoint import load_backbone
from vitsinks.train.trainer import Trainer


@pytest.fixture(scope="module")
def task_runs(tmp_path_factory: pytest.TempPathFactory, sinktask_run) -> dict[str, Path]:
    runs = tmp_path_factory.mktemp("intervene_runs")
    return {"nop": sinktask_run(runs, "base", "nop", name="nop"),
            "broadcast": sinktask_run(runs, "base", "broadcast", name="bc"),
            "broadcast_1h": sinktask_run(runs, "base", "broadcast", "model.num_heads=1", name="bc1")}


def _cfg(run_dir: Path, *overrides: str):
    return load_config([f"run={run_dir}", "intervene.n_images=96", "intervene.heldout_images=32",
                        "intervene.min_events=20", *overrides])


def _cell(summary: dict, cls: str, edit: str) -> dict:
    return summary["by_class"]["block 0 (only)"][cls][edit]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_command([sys.executable, "-m", "vitsinks.intervene", *args])


@pytest.mark.slow
def test_nop_task_sink_is_causally_a_nop_from_the_command_line(task_runs: dict[str, Path], tmp_path: Path,
                                                               figures: list) -> None:
    run_dir = task_runs["nop"]
    out = _cli(f"run={run_dir}", "n_images=96", "heldout_images=32", "intervene.min_events=20")
    assert out.returncode == 0, out.stderr
    folder = run_dir / "interventions" / "last"
    summary = json.loads((folder / "summary.json").read_text())
    zero, mean = _cell(summary, "nop", "zero_sink_value"), _cell(summary, "nop", "mean_sink_value")
    redirect = _cell(summary, "nop", "redirect_sink_attention")
    assert zero["final_patch_relrms"] < 0.01 and mean["final_patch_relrms"] < 0.01
    assert redirect["final_patch_relrms"] > 10 * max(zero["final_patch_relrms"], mean["final_patch_relrms"])
    assert summary["selected"] == ["0:0", "0:1"] and zero["n_heads"] == 2
    with (folder / "interventions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 96 * 2 * 8  # images x heads x edits (no gate, no registers)
    assert {r["event_class"] for r in rows} == {"nop"} and {r["sink_loc"] for r in rows} == {"cls"}
    order = permutation(512, 0)  # the default selection: the val split (512 items) permuted with seed 0
    zero_rows = [r for r in rows if r["edit"] == "zero_sink_value" and r["head"] == "0"]
    assert [int(r["image_index"]) for r in zero_rows] == order[:96]
    for r in rows:
        i = int(r["image"])
        donor = order[i // 32 * 32 + (i % 32 + 1) % 32]  # the next image of its batch of 32
        if r["edit"] == "shuffle_sink_value":  # another image of its batch (a derangement)
            assert int(r["donor_index"]) in order[i // 32 * 32 : i // 32 * 32 + 32]
            assert int(r["donor_index"]) != int(r["image_index"])
        else:
            assert int(r["donor_index"]) == (donor if r["edit"].startswith("donor") else -1)
        random = r["edit"] in ("donor_nonsink_value", "zero_random_nonsink_value")
        assert (1 <= int(r["random_token"]) < 65) if random else int(r["random_token"]) == -1
    assert summary["protocol"]["name"] == "vitsinks" and summary["images"]["heldout"] == 32
    assert {k: summary["images"][k] for k in ("order", "seed", "edited")} == {"order": "permuted", "seed": 0,
                                                                               "edited": 96}
    assert "Protocol vitsinks: images in the order of the permutation seed 0" in (folder / "by_class.md").read_text()
    assert float(summary["checks"]["value_edit_error_max"]) < 1e-8
    assert "| nop | redirect_sink_attention | 2 |" in (folder / "by_class.md").read_text()
    assert (folder / "interventions.png").stat().st_size > 10_000 and (folder / "config.yaml").is_file()
    heads = report.by_head(report.read_rows(folder / "interventions.csv"))
    report.figure(heads, summary, tmp_path / "again.png")  # the bars are the summary's class means
    nop = report.InterventionsReport.from_json(summary).classes("main")["nop"]
    shown = [e for e in EDITS if e in nop]
    assert bar_heights(figures[-1].axes[0]) == [nop[e]["final_patch_relrms"] for e in shown]
    assert "interventions (heads x batches)" in out.stderr  # the progress bar
    row = collect(run_dir)  # the leaderboard's causal columns read this summary
    assert row["causal_zero_nop"] == zero["final_patch_relrms"]
    assert row["causal_redirect_nop"] == redirect["final_patch_relrms"]


@pytest.mark.slow
def test_broadcast_task_sink_moves_every_patch_coherently_towards_the_donor(task_runs: dict[str, Path]) -> None:
    summary, _ = run(_cfg(task_runs["broadcast"]))
    assert _cell(summary, "broadcast", "zero_sink_value")["coherence"] > 0.8
    # one head carries the whole payload: swapping in the donor's sink value moves the patches to the donor's
    one, _ = run(_cfg(task_runs["broadcast_1h"]))
    assert _cell(one, "broadcast", "zero_sink_value")["coherence"] > 0.8
    assert _cell(one, "broadcast", "donor_sink_value")["donor_cosine"] >= 0.9


@pytest.mark.slow
def test_redirect_on_the_broadcast_task_agrees_with_float64_row_by_row(task_runs: dict[str, Path]) -> None:
    """Acceptance: every row of the redirect edit, rebuilt from its recorded split index and sink in a float64 copy
    of the checkpoint (probability rescaling, exact in float64 at these leads), within 1e-3 relative."""
    run_dir = task_runs["broadcast"]
    _, out = run(_cfg(run_dir, "intervene.edits=[redirect_sink_attention]", f"intervene.out={run_dir / 'iv_red'}"))
    rows = report.read_rows(out / "interventions.csv")
    model, ccfg = load_backbone(run_dir / "checkpoints" / "last.pt")
    val = build_dataset(ccfg.data, "val", ccfg.seed)
    for head in (0, 1):
        mine = [r for r in rows if r["head"] == head]
        x = torch.stack([val[r["image_index"]][0] for r in mine])
        sink = torch.tensor([r["sink_idx"] for r in mine])
        truth = final_patch_relrms_with(model, x, 0, head, sink, torch.float64, rescaled)
        ours = np.array([r["final_patch_relrms"] for r in mine])
        assert len(mine) == 96 and (np.abs(ours - truth) / truth < 1e-3).all()


@pytest.mark.slow
def test_reused_diagnostics_are_checked_against_the_live_ones(task_runs: dict[str, Path]) -> None:
    run_dir = task_runs["nop"]
    ckpt = run_dir / "checkpoints" / "last.pt"
    cfg = _cfg(run_dir, "intervene.out=" + str(run_dir / "iv_reuse"), "intervene.edits=[zero_sink_value]")
    diagnose_checkpoint(ckpt, load_config(["diagnostics.n_images=128", "diagnostics.plots=false"]))
    summary, _ = run(cfg)
    assert summary["stage1"].startswith("reused") and "per_image.npz" in summary["stage1"]
    npz = run_dir / "diagnostics" / "last" / "per_image.npz"
    d = dict(np.load(npz))
    d["sink_idx"] = (d["sink_idx"] + 1) % 65  # stale: other sinks than this checkpoint has
    np.savez_compressed(npz, **d)
    with pytest.raises(ValueError, match="stale"):
        run(cfg)
    ckpt.touch()  # a checkpoint newer than its diagnostics: they are not reused at all
    assert run(cfg)[0]["stage1"] == "computed"


@pytest.mark.slow
def test_shards_merge_to_the_unsharded_result(task_runs: dict[str, Path], tmp_path: Path) -> None:
    run_dir = task_runs["nop"]
    base = ["intervene.edits=[zero_sink_value,donor_sink_value]", "intervene.n_images=40"]  # no random draws
    run(_cfg(run_dir, *base, f"intervene.out={tmp_path / 'whole'}"))
    sharded = tmp_path / "sharded"
    for k in (0, 1):
        meta, _ = run(_cfg(run_dir, *base, f"intervene.out={sharded}", f"intervene.shard={k}", "intervene.nshards=2"))
        assert meta["heads"] == [["0:0"], ["0:1"]][k]
    with pytest.raises(ValueError, match="missing"):
        (sharded / "shards" / "1-of-2" / "meta.json").rename(sharded / "meta.json.bak")
        merge(sharded)
    (sharded / "meta.json.bak").rename(sharded / "shards" / "1-of-2" / "meta.json")
    merge(sharded)
    assert "nshards: 2" in (sharded / "config.yaml").read_text()
    whole = (tmp_path / "whole" / "interventions.csv").read_text().splitlines()
    joined = (sharded / "interventions.csv").read_text().splitlines()
    assert sorted(whole) == sorted(joined) and len(whole) == 1 + 40 * 2 * 2


@pytest.mark.slow
def test_online_probe_effects_and_register_edit_on_a_lejepa_checkpoint(runs: Path) -> None:
    cfg = tiny_cfg(runs, "exp=reg", "name=probe")
    Trainer(cfg).fit()
    summary, out = run(load_config([f"run={runs / 'probe'}", "intervene.n_images=16", "intervene.heldout_images=0",
                                    "intervene.edits=[drop_registers]"]))
    cell = summary["by_class"]["whole model"]["model"]["drop_registers"]
    assert cell["final_patch_relrms"] > 0 and 0 <= cell["probe_agree"] <= 1 and cell["probe_kl"] >= 0
    with (out / "interventions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16 and all(r["probe_ce"] and r["probe_ce_base"] for r in rows)


@pytest.mark.slow
def test_register_controls_on_a_timm_state_dict_file(tmp_path: Path) -> None:
    """A timm model's weights file (DINOv2-reg layout) from the command line. At block 0's input every image's
    registers are the same learned tokens, so their mean over images and another image's are exactly them: those
    two controls change nothing there, while zeroing them does; from block 1 on, they differ per image."""
    torch.manual_seed(0)
    ref = VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=0,
                            reg_tokens=4, no_embed_class=True, init_values=1.0).eval()
    with torch.no_grad():  # timm starts its registers at ~1e-6: give them content, so zeroing them is an edit
        ref.reg_token.normal_()
    weights = tmp_path / "dinov2_like.pth"
    torch.save(ref.state_dict(), weights)
    out = _cli(*TINY, "exp=reg", f"model.pretrained={weights}", "model.layerscale_init=1.0", "n_images=8",
               "intervene.heldout_images=8", f"runs_dir={tmp_path / 'runs'}",
               "intervene.edits=[zero_registers,mean_registers,shuffle_registers]")
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "runs" / "dinov2_like" / "interventions" / "last"  # in its import, named by the file
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["n_images"] == 8 and summary["n_blocks"] == 2 and summary["subject"].endswith("(reg)")
    change = {(c["block"], c["edit"]): c["final_patch_relrms"] for c in summary["register_controls"]}
    assert change[(0, "mean_registers")] == 0.0 and change[(0, "shuffle_registers")] == 0.0
    noise = 1e-5  # well above float32 rounding of the final patches (~1e-7)
    assert change[(0, "zero_registers")] > noise and change[(1, "shuffle_registers")] > 0


def test_the_cache_key_of_a_checkpoint_changes_when_the_file_is_rewritten(tmp_path: Path) -> None:
    """The same path with new weights is another model: its cached stage 1 must not be reused."""
    weights = tmp_path / "w.pth"
    torch.save(tiny_vit().state_dict(), weights)
    ckpt = imported_run(tiny_cfg(tmp_path / "runs", f"model.pretrained={weights}")).last
    cfg = tiny_cfg(tmp_path / "runs", f"ckpt={ckpt}")
    first = resolve(cfg).identity()  # what the interventions' key is made of
    assert resolve(cfg).identity() == first  # nothing changed: the same key
    stat = ckpt.stat()
    os.utime(ckpt, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten in place, same size
    assert resolve(cfg).identity() != first


@pytest.mark.parametrize(("override", "message"), [
    ("intervene.heads=[0:7]", "head 7 is out of range"), ("intervene.edits=[zap]", "unknown edit"),
    ("intervene.edits=[open_gate]", "needs a model with the gate mitigation \\(e.g. model.gate=elementwise\\)"),
    ("intervene.edits=[drop_registers]", "register tokens"),
    ("intervene.n_images=9999", "9999 \\+ 32 images were asked for but the split has 512")])
@pytest.mark.slow
def test_bad_input_is_refused_with_its_fix(task_runs: dict[str, Path], override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run(_cfg(task_runs["nop"], override))


@pytest.mark.slow
def test_the_command_line_exits_1_with_one_line(task_runs: dict[str, Path], tmp_path: Path) -> None:
    for args, message in (([f"run={task_runs['nop']}", "heads=0:7"], "head 7 is out of range"),
                          ([f"run={tmp_path / 'nothing'}"], "checkpoints/last.pt")):
        out = _cli(*args)
        assert out.returncode == 1 and message in out.stderr and "Traceback" not in out.stderr


def test_torn_shards_are_one_line_and_torn_stage1_fields_are_computed_again(task_runs: dict[str, Path],
                                                                             tmp_path: Path, capsys) -> None:
    from vitsinks.utils.files import BadFile

    run_dir = task_runs["nop"]
    base = ["intervene.edits=[zero_sink_value]", "intervene.n_images=8", "intervene.min_events=4"]
    sharded = tmp_path / "sharded"
    for k in (0, 1):
        run(_cfg(run_dir, *base, f"intervene.out={sharded}", f"intervene.shard={k}", "intervene.nshards=2"))
    meta = sharded / "shards" / "1-of-2" / "meta.json"
    whole = meta.read_text()
    meta.write_text(whole[:40])
    with pytest.raises(BadFile, match=r"meta.json is torn .*rerun the shard 1-of-2"):
        merge(sharded)
    meta.write_text(whole)
    rows = sharded / "shards" / "0-of-2" / "rows.csv"
    rows.write_text(rows.read_text()[: len(rows.read_text()) // 2])
    with pytest.raises(BadFile, match=r"rows.csv is torn .*rerun the shard 0-of-2"):
        merge(sharded)

    src = tmp_path / "nop"  # a copy: the module's runs stay as they are
    shutil.copytree(run_dir, src)
    last = src / "checkpoints" / "last.pt"
    diagnose_checkpoint(last, load_config([f"ckpt={last}", "data=sinktask_nop", "diagnostics.n_images=8",
                                           "diagnostics.plots=false", "diagnostics.report=false"]))
    summary, _ = run(_cfg(src, *base, f"intervene.out={tmp_path / 'reused'}"))
    npz = src / "diagnostics" / "last" / "per_image.npz"
    assert summary["stage1"] == f"reused {npz}"  # the checkpoint's diagnosis is reused by stage 1 ...
    npz.write_bytes(npz.read_bytes()[:300])
    capsys.readouterr()
    summary, _ = run(_cfg(src, *base, f"intervene.out={tmp_path / 'again'}"))  # ... unless it is torn
    assert "is torn: its diagnostics fields are computed again" in capsys.readouterr().out
    assert summary["stage1"] == "computed"


@pytest.mark.slow
def test_interventions_killed_mid_write_are_written_whole_by_the_same_command(sinktask_run, tmp_path: Path) -> None:
    """SIGKILL while the report's first file is written: the same command again writes the whole report and leaves
    no staging folder or temp file of the killed one."""
    from tests.helpers.killed import killed, staging

    src = sinktask_run(tmp_path, "base", "nop", name="nop")  # a copy of the session's trained run
    argv = [f"run={src}", "intervene.edits=[zero_sink_value]", "intervene.n_images=8", "intervene.min_events=4"]
    out = killed("vitsinks.intervene", argv, "fsync:interventions.csv")
    assert out.returncode == -9, out.stderr[-2000:]
    folder = src / "interventions" / "last"
    assert staging(folder) and not (folder / "summary.json").exists()
    done = _cli(*argv)
    assert done.returncode == 0, done.stderr[-2000:]
    assert staging(src) == [] and json.loads((folder / "summary.json").read_text())["n_images"] == 8
