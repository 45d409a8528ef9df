"""A pretrained model imported as a run: what it holds, when it is read again and when it is refused, and that every
command then treats it as a trained run (probes, W8A8 with the probes' change, a leaderboard row of its own)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer

from tests.helpers.tiny import tiny_cfg, tiny_vit
from vitsinks.configs.schema import load_config
from vitsinks.eval import linear
from vitsinks.leaderboard import leaderboard_command
from vitsinks.quantize import quantize
from vitsinks.report.collect import collect
from vitsinks.run.imported import _make, import_key, imported_run, with_tag
from vitsinks.run.source import resolve
from vitsinks.train.checkpoint import load_backbone
from vitsinks.utils.errors import BadValue, ConfigError
from vitsinks.utils.rundir import RunDir, find_runs

REG = ("exp=reg", "model.layerscale_init=1.0")  # the DINOv2-reg layout below: 4 registers, layer scale


def dinov2_like(path: Path, seed: int = 0) -> VisionTransformer:
    """A timm ViT in DINOv2-reg layout, its state dict saved to `path`."""
    torch.manual_seed(seed)
    ref = VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=0,
                            reg_tokens=4, no_embed_class=True, init_values=1.0).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ref.state_dict(), path)
    return ref


def test_an_import_computes_what_the_timm_model_does_and_is_read_again_not_rewritten(tmp_path: Path) -> None:
    ref = dinov2_like(tmp_path / "dinov2_like.pth")
    cfg = tiny_cfg(tmp_path / "runs", *REG, f"model.pretrained={tmp_path / 'dinov2_like.pth'}",
                   "views.global_size=64", "trainfree.method=zero_massive", "seed=3")
    run = imported_run(cfg)
    assert run.path == tmp_path / "runs" / "dinov2_like"
    model, saved = load_backbone(run.last)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model.eval().forward_features(x), ref.forward_features(x), atol=1e-5, rtol=1e-5)
    assert saved.imported == "dinov2_like" and saved.model.pretrained is None  # the weights are in the checkpoint
    assert saved.views.global_size == 32 and saved.model.registers == 4  # the size the model takes, not the views'
    assert saved.seed == 3 and saved.trainfree.method is None  # the command's seed, not its own settings
    assert json.loads(run.status.read_text()) == {"status": "finished",
                                                  "imported_from": str(tmp_path / "dinov2_like.pth")}
    stamp = run.last.stat().st_mtime_ns
    assert imported_run(cfg).last.stat().st_mtime_ns == stamp  # the same source and settings: read, not rewritten
    assert resolve(cfg).checkpoint == run.last  # every command reads it there


def test_an_import_is_refused_over_anything_it_was_not_made_of(tmp_path: Path) -> None:
    weights, runs = tmp_path / "w.pth", tmp_path / "runs"
    torch.save(tiny_vit().state_dict(), weights)
    run = imported_run(tiny_cfg(runs, f"model.pretrained={weights}"))
    before = run.last.read_bytes()
    with pytest.raises(BadValue, match=re.escape("its import with other architecture settings (qkv_bias: True there "
                                                 "vs False)")):
        imported_run(tiny_cfg(runs, f"model.pretrained={weights}", "model.qkv_bias=false"))
    imported_run(tiny_cfg(runs, f"model.pretrained={weights}", "model.drop_path=0.1"))  # not the weights': read
    other = tmp_path / "elsewhere" / "w.pth"  # another file of the same name
    other.parent.mkdir()
    torch.save(tiny_vit().state_dict(), other)
    with pytest.raises(BadValue, match=re.escape(f"{run.path} holds the import of {weights.resolve()}: delete")):
        imported_run(tiny_cfg(runs, f"model.pretrained={other}"))
    stat, imported_bytes = weights.stat(), weights.read_bytes()
    torch.save(tiny_vit().state_dict(), weights)  # the file rewritten in place: other weights, the same size
    assert weights.stat().st_size == stat.st_size
    with pytest.raises(BadValue, match="holds the import of an earlier version of that file"):
        imported_run(tiny_cfg(runs, f"model.pretrained={weights}"))
    assert run.last.read_bytes() == before  # nothing was replaced
    weights.write_bytes(imported_bytes)
    trained = runs / "t"  # a trained run's folder, whose name a weights file t.pth would take
    trained.mkdir()
    (trained / "config.yaml").write_text("name: t\n")
    torch.save(tiny_vit().state_dict(), tmp_path / "t.pth")
    with pytest.raises(BadValue, match=re.escape(f"{trained} is a run, not an import of")):
        imported_run(tiny_cfg(runs, f"model.pretrained={tmp_path / 't.pth'}"))
    assert sorted(p.name for p in trained.iterdir()) == ["config.yaml"]
    for name, what in (("gate+reg", "a variant"), ("softpick+reg", "a variant"),  # (no exp file names the second)
                       ("quant", "a folder of the runs folder")):
        torch.save(tiny_vit().state_dict(), tmp_path / f"{name}.pt")  # its rows would merge with the variant's
        with pytest.raises(BadValue, match=re.escape(f"imported as '{name}', which names {what}: rename the file")):
            imported_run(tiny_cfg(runs, f"model.pretrained={tmp_path / f'{name}.pt'}"))
    assert sorted(p.name for p in runs.iterdir()) == ["t", "w"]
    refusal = f"is a run's checkpoint, not weights to import: read it with ckpt={run.last}"
    with pytest.raises(BadValue, match=re.escape(refusal)):
        imported_run(tiny_cfg(runs, f"model.pretrained={run.last}"))  # it would be imported as 'last'
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the file as it was imported
    run.last.unlink()  # an import that lost its weights
    with pytest.raises(BadValue, match="holds its import without checkpoints/last.pt: delete that folder"):
        imported_run(tiny_cfg(runs, f"model.pretrained={weights}"))


def test_a_moved_or_copied_file_reads_its_import(tmp_path: Path) -> None:
    weights, runs = tmp_path / "w.pth", tmp_path / "runs"
    torch.save(tiny_vit().state_dict(), weights)
    run = imported_run(tiny_cfg(runs, f"model.pretrained={weights}"))
    stamp = run.last.stat().st_mtime_ns
    copy = tmp_path / "copied" / "w.pth"  # a new path and a new modification time, the same bytes
    copy.parent.mkdir()
    copy.write_bytes(weights.read_bytes())
    weights.unlink()
    assert imported_run(tiny_cfg(runs, f"model.pretrained={copy}")).path == run.path
    assert run.last.stat().st_mtime_ns == stamp  # read, not imported again
    assert json.loads((run.path / "source.json").read_text())["source"] == str(copy.resolve())  # no hash next time
    with pytest.raises(BadValue, match="other architecture settings"):  # the bytes alone do not make it the same
        imported_run(tiny_cfg(runs, f"model.pretrained={copy}", "model.qkv_bias=false"))
    raw = tmp_path / "checkpoints" / "raw.pth"  # weights in a folder named checkpoints, not a run's: imported
    raw.parent.mkdir()
    raw.write_bytes(copy.read_bytes())
    assert imported_run(tiny_cfg(runs, f"model.pretrained={raw}")).path == runs / "raw"
    record = json.loads((run.path / "source.json").read_text())
    del record["sha256"]  # an import made before the hash was recorded: read by its path and time alone
    (run.path / "source.json").write_text(json.dumps(record))
    imported_run(tiny_cfg(runs, f"model.pretrained={copy}"))
    again = tmp_path / "again" / "w.pth"
    again.parent.mkdir()
    again.write_bytes(copy.read_bytes())
    with pytest.raises(BadValue, match=re.escape(f"holds the import of {copy.resolve()}")):
        imported_run(tiny_cfg(runs, f"model.pretrained={again}"))


def test_two_processes_importing_at_once_end_with_one_import(tmp_path: Path) -> None:
    """The second to finish finds the first's import in place: the same one is kept (its rename loses), another
    one is refused; neither leaves its hidden folder behind."""
    weights, runs = tmp_path / "w.pth", tmp_path / "runs"
    torch.save(tiny_vit().state_dict(), weights)
    cfg = tiny_cfg(runs, f"model.pretrained={weights}")
    run = imported_run(cfg)
    stamp = run.last.stat().st_mtime_ns
    _make(cfg, run, import_key(cfg))  # a slower process made the same import: its rename fails, quietly
    assert run.last.stat().st_mtime_ns == stamp
    other = tiny_cfg(runs, f"model.pretrained={weights}", "model.attn=relu")  # the same weights load
    with pytest.raises(BadValue, match="other architecture settings"):
        _make(other, run, import_key(other))
    assert sorted(p.name for p in runs.iterdir()) == ["w"]


def test_a_timm_name_and_its_default_tag_are_one_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arch = "vit_small_patch14_reg4_dinov2"
    tag = timm.create_model(arch, pretrained=False).pretrained_cfg["tag"]  # the weights timm loads for the bare name
    asked: list[str] = []

    def hub(name: str, pretrained: bool = False, **kw: object) -> VisionTransformer:  # the hub, offline
        asked.append(name)
        return dinov2_like(tmp_path / "hub.pth")

    monkeypatch.setattr(timm, "create_model", hub)
    runs = [imported_run(tiny_cfg(tmp_path / "runs", *REG, f"model.pretrained={name}")).path
            for name in (arch, f"{arch}.{tag}", f"timm/{arch}")]
    assert runs == [tmp_path / "runs" / f"{arch}.{tag}"] * 3
    assert asked == [f"{arch}.{tag}"]  # imported once, read after
    named_so = tmp_path / arch  # a file is named by its file, even one named as a timm model
    named_so.write_bytes(b"")
    assert with_tag(str(named_so)) == str(named_so)


def test_a_deprecated_timm_alias_is_the_import_of_the_name_timm_maps_it_to() -> None:
    alias = next(a for a, name in timm.models.get_deprecated_models().items() if a.startswith("vit_") and "." in name)
    with pytest.warns(UserWarning, match="deprecated"):
        cfg = timm.create_model(alias, pretrained=False).pretrained_cfg  # timm's own reading of the alias
    assert with_tag(alias) == with_tag(f"timm/{alias}") == f"{cfg['architecture']}.{cfg['tag']}"


def test_imported_is_not_a_setting() -> None:
    with pytest.raises(ConfigError, match=re.escape("imported=x (set by vitsinks")):
        load_config(["imported=x"])


@pytest.mark.slow
def test_a_pretrained_model_gets_probes_w8a8_with_their_change_and_its_own_leaderboard_row(tmp_path: Path) -> None:
    weights, runs = tmp_path / "dinov2_like.pth", tmp_path / "runs"
    dinov2_like(weights)
    evals = ("eval.max_train_images=32", "eval.max_val_images=8", "eval.linear_epochs=1", "eval.linear_lrs=[0.01]")
    cfg = tiny_cfg(runs, *REG, f"model.pretrained={weights}", *evals, "quant.n_images=4", "quant.calib_images=4")
    linear.run(cfg)  # imports it, and probes it as a trained run's checkpoint
    run = RunDir(runs / "dinov2_like")
    lin = json.loads(run.result("linear").read_text())
    assert lin["checkpoint"] == str(run.last)
    result, path = quantize(cfg)
    assert path == run.result("quant") and result.linear_top1 is not None  # the probe's change, as for a run
    assert result.linear_top1["fp32"] == lin["best"]["top1"]
    assert result.online_top1 is None  # no online probe: not a LeJEPA run
    assert [r.name for r in find_runs(runs)] == ["dinov2_like"]
    row = collect(run)
    assert row["variant"] == "dinov2_like" and row["linear_top1"] == lin["best"]["top1"]
    assert row["w8a8_d_linear"] == pytest.approx(result.linear_top1["delta"])
    assert leaderboard_command([f"runs={runs}", f"out={tmp_path / 'board'}"]) == 0
    assert "| dinov2_like | 1 |" in (tmp_path / "board" / "leaderboard.md").read_text()


@pytest.mark.parametrize(("command", "sources"), [
    ("diagnose", ("hub", "ckpt")), ("diagnose", ("hub", "run")), ("diagnose", ("hub", "model.pretrained")),
    ("diagnose", ("ckpt", "run")), ("intervene", ("hub", "ckpt")), ("intervene", ("hub", "model.pretrained")),
])
def test_two_model_sources_are_refused_in_one_line_before_anything_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, sources: tuple[str, str]) -> None:
    """Each would read one source and leave the other out without a word (hub= won over ckpt=)."""
    from vitsinks.diagnose import cli as diagnose_cli
    from vitsinks.intervene import cli as intervene_cli

    given = {"hub": f"timm:vit_tiny_patch16_224@{tmp_path / 'tiny.pth'}", "ckpt": str(tmp_path / "last.pt"),
             "run": str(tmp_path / "runs" / "a"), "model.pretrained": str(tmp_path / "weights.pth")}
    args = [f"{k}={given[k]}" for k in sources]
    with pytest.raises(SystemExit) as exit_:
        {"diagnose": diagnose_cli, "intervene": intervene_cli}[command]([*args, f"runs_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and len(err) == 1, err
    ordered = [a for k in ("ckpt", "run", "model.pretrained", "hub") for a in args if a.startswith(f"{k}=")]
    assert err[0] == (f"error: two model sources, {' and '.join(ordered)}: name the model once, with one of ckpt=, "
                      f"run=, model.pretrained=, hub=")
    assert not (tmp_path / "runs").exists()
