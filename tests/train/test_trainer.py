"""Training loop: learning, exact resume, DDP equivalence, wandb offline, and every bad input."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from PIL import Image

from tests.helpers.distributed import free_port
from tests.helpers.tiny import tiny_cfg
from vitsinks.data import BadImage
from vitsinks.objectives.monitors import KNN, RANKME
from vitsinks.train import checkpoint as ckpt
from vitsinks.train.callbacks import Callback, StatusFile
from vitsinks.train.checkpoint import CheckpointMismatch
from vitsinks.train.optim import WarmupCosine
from vitsinks.train.trainer import NonFiniteLoss, Trainer
from vitsinks.utils import files
from vitsinks.utils.metrics_log import read_metrics


def losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_metrics(run_dir) if "loss" in m}


@pytest.mark.slow
def test_short_run_lowers_loss_and_probe_beats_chance(runs: Path) -> None:
    cfg = tiny_cfg(runs, "data.train_size=512", "train.batch_size=32", "train.epochs=3", "train.lr=2e-3",
                   "data.val_size=256", "train.ckpt_every=1000")
    summary = Trainer(cfg).fit()
    curve = losses(Path(summary["run_dir"]))
    first, last = sum(list(curve.values())[:5]) / 5, sum(list(curve.values())[-5:]) / 5
    assert last < 0.9 * first, curve
    assert summary["val/probe_acc"] > 0.25 + 0.15  # 4 classes: chance is 0.25
    run = Path(summary["run_dir"])
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.pt").is_file()
    assert "name: " + cfg.name in (run / "config.yaml").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["lejepa", "supervised"])
def test_every_validation_logs_the_monitors_and_they_never_change_training(runs: Path, objective: str) -> None:
    on = Trainer(tiny_cfg(runs, f"objective={objective}", "name=on")).fit()
    Trainer(tiny_cfg(runs, f"objective={objective}", "name=off", "monitors.knn_bank=0", "monitors.rankme=false")).fit()
    val = [m for m in read_metrics(runs / "on") if any(k.startswith("val/") for k in m)]
    assert [m["epoch"] for m in val] == [0, 1] and all({KNN, RANKME} <= set(m) for m in val)  # every epoch's
    assert all(0 <= m[KNN] <= 1 and 1 <= m[RANKME] <= 48 for m in val)  # 48: the tiny ViT's width
    assert on[KNN] == val[-1][KNN] and on[RANKME] == val[-1][RANKME]  # the run's summary: the last validation
    assert not any(k in m for m in read_metrics(runs / "off") for k in (KNN, RANKME))  # monitors.* switch them off
    assert losses(runs / "on") == losses(runs / "off")  # bit for bit: the monitors take no random draw, no step


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", [2, 4])  # mid-epoch, and exactly at the end of epoch 0
def test_interrupted_and_resumed_run_is_bitwise_identical(runs: Path, stop_at: int) -> None:
    Trainer(tiny_cfg(runs, "name=straight")).fit()

    def stop(tr: Trainer) -> None:
        if tr.progress.step == stop_at:
            tr.request_stop()

    first = Trainer(tiny_cfg(runs, "name=resumed")).fit(on_step=stop)
    assert first["status"] == "interrupted" and first["step"] == stop_at
    second = Trainer(tiny_cfg(runs, "name=resumed")).fit()
    assert second["status"] == "finished"
    straight, resumed = losses(runs / "straight"), losses(runs / "resumed")
    assert len(straight) == 8 and straight == resumed  # exact float equality at every step
    a = torch.load(runs / "straight/checkpoints/last.pt", weights_only=False)["model"]
    b = torch.load(runs / "resumed/checkpoints/last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_holds_the_whole_state(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "train.max_steps=3")).fit()
    state = ckpt.load(next(runs.glob("*/checkpoints/last.pt")))
    assert {"model", "optimizer", "scheduler", "scaler", "rng", "progress", "config", "variant"} <= set(state)
    assert {"python", "numpy", "torch"} <= set(state["rng"])
    assert state["progress"] == {"epoch": 0, "batch": 3, "step": 3}
    assert any(k.startswith("projector.") for k in state["model"]) and "probe.1.weight" in state["model"]
    assert len(list(runs.glob("*/checkpoints/step_0000003.pt"))) == 1


class Recorder(Callback):
    """Every hook call, as (hook, step, epoch, extra)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_fit_start(self, trainer: Trainer) -> None:
        self.calls.append(("fit_start", trainer.progress.step))

    def on_step_end(self, trainer: Trainer, terms: dict) -> None:
        self.calls.append(("step_end", trainer.progress.step, sorted(terms)[:1]))

    def on_epoch_end(self, trainer: Trainer, epoch: int) -> None:
        self.calls.append(("epoch_end", trainer.progress.step, epoch, trainer.progress.epoch))

    def on_save(self, trainer: Trainer) -> None:
        self.calls.append(("save", trainer.progress.step, trainer.rundir.last.is_file()))

    def on_fit_end(self, trainer: Trainer, status: str) -> None:
        self.calls.append(("fit_end", trainer.progress.step, status))

    def close(self, trainer: Trainer) -> None:
        self.calls.append(("close",))


def test_callbacks_see_the_loop_in_order_and_close_after_a_failure(runs: Path) -> None:
    rec = Recorder()
    Trainer(tiny_cfg(runs, "name=cb", "data.train_size=32"), callbacks=[rec]).fit()  # 2 steps an epoch, 4 in all
    steps = [("step_end", k, ["invariance"]) for k in range(1, 5)]
    # the trainer's own callbacks run first: a hook's checkpoint is written (on_save) before a later callback's hook
    assert rec.calls == [("fit_start", 0), *steps[:2], ("save", 2, True), ("epoch_end", 2, 0, 1), ("save", 3, True),
                         steps[2], steps[3], ("save", 4, True), ("fit_end", 4, "finished"), ("close",)]
    metrics = read_metrics(runs / "cb")
    assert [m["step"] for m in metrics if "val/probe_acc" in m] == [2, 4]  # validation: epoch 0's end, the end
    rec = Recorder()

    def fail(tr: Trainer) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Trainer(tiny_cfg(runs, "name=cb2"), callbacks=[rec]).fit(on_step=fail)
    assert rec.calls[-1] == ("close",) and ("fit_end", 1, "finished") not in rec.calls
    assert '"failed"' in (runs / "cb2" / "status.json").read_text()


def test_warmup_cosine_schedule() -> None:
    s = WarmupCosine(warmup=4, total=14, min_ratio=1e-3)
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s(4) == 1.0 and abs(s(9) - (1e-3 + (1 - 1e-3) * 0.5)) < 1e-12 and abs(s(14) - 1e-3) < 1e-12


def _ddp_worker(rank: int, world: int, port: int, runs: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from vitsinks.utils.distributed import cleanup

    try:
        Trainer(tiny_cfg(Path(runs), "name=ddp", "train.max_steps=3")).fit()
    finally:
        cleanup()


@pytest.mark.slow
def test_two_process_ddp_matches_one_process_on_the_same_global_batch(runs: Path) -> None:
    torch.set_num_threads(1)
    Trainer(tiny_cfg(runs, "name=single", "train.max_steps=3")).fit()
    mp.spawn(_ddp_worker, args=(2, free_port(), str(runs)), nprocs=2, join=True)
    single = torch.load(runs / "single/checkpoints/last.pt", weights_only=False)["model"]
    ddp = torch.load(runs / "ddp/checkpoints/last.pt", weights_only=False)["model"]
    assert single.keys() == ddp.keys()
    # The final-norm bias shifts every embedding alike and the projector's BatchNorm removes that shift, so its
    # gradient is zero in exact arithmetic: AdamW turns the float noise into +-lr steps. Everything else must match.
    compared = [k for k in single if single[k].is_floating_point() and k != "backbone.norm.bias"]
    for k in compared:
        torch.testing.assert_close(ddp[k], single[k], atol=5e-5, rtol=1e-4, msg=k)
    assert len(compared) > 20
    initial = Trainer(tiny_cfg(runs, "name=init")).model.state_dict()
    assert not torch.allclose(initial["backbone.blocks.0.mlp.fc1.weight"], ddp["backbone.blocks.0.mlp.fc1.weight"])
    assert losses(runs / "single") == pytest.approx(losses(runs / "ddp"), rel=1e-4)


def wandb_history_keys(path: Path) -> set[str]:
    """Keys of the history records in a `.wandb` file (a LevelDB-style log of protobuf `Record`s)."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw, block, pos, records, partial = path.read_bytes(), 32768, 7, [], b""  # 7-byte ':W&B' file header
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # block trailer padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        chunk, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # full record, or last fragment
            records.append(partial + chunk)
            partial = b""
        elif kind in (2, 3):  # first / middle fragment
            partial += chunk
    keys: set[str] = set()
    for data in records:
        rec = pb.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "history":
            keys |= {item.key or "/".join(item.nested_key) for item in rec.history.item}
    return keys


@pytest.mark.slow
def test_wandb_offline_writes_a_run_with_the_logged_keys(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "name=wb", "wandb.mode=offline", "train.max_steps=2")).fit()
    files = list((runs / "wb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    keys = wandb_history_keys(files[0])
    assert {"loss", "sigreg", "invariance", "probe_acc", "lr", "val/probe_acc", "bad_images", KNN, RANKME} <= keys
    assert set(read_metrics(runs / "wb")[0]) - {"step"} <= keys


# ---- bad input --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_missing_or_empty_data_root_fails_at_start(runs: Path, tmp_path: Path, kind: str) -> None:
    root = tmp_path / "imagenet"
    if kind == "empty":
        root.mkdir()
    with pytest.raises(FileNotFoundError, match=str(root)) as err:
        Trainer(tiny_cfg(runs, "data=imagenet", f"data.root={root}"))
    assert "data.root" in str(err.value)
    assert not runs.exists()


def _imagefolder(root: Path, corrupt: bool) -> None:
    for split in ("train", "val"):
        for c, cls in enumerate(["n01440764", "n01443537"]):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(8):
                Image.new("RGB", (40, 40), (40 * c + 5 * i, 100, 200 - 9 * i)).save(d / f"{cls}_{i}.JPEG")
    if corrupt:
        (root / "train" / "n01440764" / "n01440764_3.JPEG").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")


def test_corrupt_jpeg_is_skipped_and_counted(runs: Path, tmp_path: Path) -> None:
    _imagefolder(tmp_path / "in1k", corrupt=True)
    cfg = tiny_cfg(runs, "data=imagenet", f"data.root={tmp_path / 'in1k'}", "data.num_workers=0",
                   "train.epochs=1")
    summary = Trainer(cfg).fit()
    assert summary["status"] == "finished" and summary["bad_images"] == 1
    assert read_metrics(Path(summary["run_dir"]))[-2]["bad_images"] == 1


def test_corrupt_jpeg_raises_when_asked(runs: Path, tmp_path: Path) -> None:
    _imagefolder(tmp_path / "in1k", corrupt=True)
    cfg = tiny_cfg(runs, "data=imagenet", f"data.root={tmp_path / 'in1k'}", "data.on_bad_image=error",
                   "data.num_workers=2",  # the error crosses from a loader worker to the main process
                   "train.epochs=1")
    with pytest.raises(BadImage, match="n01440764_3.JPEG"):
        Trainer(cfg).fit()


@pytest.mark.slow
def test_resuming_with_another_variant_is_refused_and_nothing_overwritten(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "name=shared", "train.max_steps=2")).fit()
    last = runs / "shared/checkpoints/last.pt"
    before = last.read_bytes(), (runs / "shared/config.yaml").read_text(), (runs / "shared/metrics.jsonl").read_text()
    with pytest.raises(CheckpointMismatch, match=r"base vit_cpu.*gate\+reg vit_cpu"):
        Trainer(tiny_cfg(runs, "name=shared", "exp=gate+reg")).fit()
    with pytest.raises(CheckpointMismatch, match="depth: 2 vs 3"):
        Trainer(tiny_cfg(runs, "name=shared", "model.depth=3")).fit()
    after = last.read_bytes(), (runs / "shared/config.yaml").read_text(), (runs / "shared/metrics.jsonl").read_text()
    assert before == after


@pytest.mark.slow
def test_nan_loss_stops_with_step_and_terms_and_keeps_last_good_checkpoint(runs: Path) -> None:
    def poison(tr: Trainer) -> None:  # after the step-3 checkpoint, break the weights
        if tr.progress.step == 3:
            with torch.no_grad():
                tr.model.backbone.blocks[0].attn.qkv.weight.fill_(float("nan"))

    cfg = tiny_cfg(runs, "name=nan")
    trainer = Trainer(cfg)
    with pytest.raises(NonFiniteLoss, match=r"step 4: loss=nan sigreg=nan invariance=nan") as err:
        trainer.fit(on_step=poison)
    assert "last.pt" in str(err.value)
    state = ckpt.load(runs / "nan/checkpoints/last.pt")
    assert state["progress"]["step"] == 3
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


def test_failure_while_writing_a_checkpoint_keeps_the_previous_one(runs: Path, monkeypatch) -> None:
    trainer = Trainer(tiny_cfg(runs, "name=io", "train.max_steps=2"))
    trainer.fit()
    last = runs / "io/checkpoints/last.pt"
    good = last.read_bytes()

    def torn_save(obj, f) -> None:  # write half a file, then fail like a full disk or a kill
        f.write(good[: len(good) // 2])
        raise OSError("No space left on device")

    monkeypatch.setattr(ckpt.torch, "save", torn_save)
    trainer.progress.step += 1
    with pytest.raises(OSError, match="No space left"):
        trainer.save()
    assert last.read_bytes() == good
    assert ckpt.load(last)["progress"]["step"] == 2
    assert [p.name for p in last.parent.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("every_s", [0.0, 3600.0])
def test_status_file_shows_the_step_while_training_throttled(runs: Path, monkeypatch, every_s: float) -> None:
    monkeypatch.setattr(StatusFile, "every_s", every_s)
    writes, seen = [], []
    real = files.write_json
    monkeypatch.setattr(files, "write_json", lambda path, obj: (writes.append(Path(path).name), real(path, obj)))

    def read(tr: Trainer) -> None:  # after the trainer's own callbacks
        seen.append(json.loads((tr.run_dir / "status.json").read_text()))
        assert not list(tr.run_dir.glob(".status.json.*")), "a temp file left: the write is not atomic"

    summary = Trainer(tiny_cfg(runs, "name=st", "data.train_size=32")).fit(on_step=read)  # 4 steps
    assert summary["status"] == "finished"
    assert {s["status"] for s in seen} == {"running"} and all(s["total_steps"] == 4 for s in seen)
    # every step shows itself, but the last (the trainer then writes `finished`); throttled: the start's step 0
    assert [s["step"] for s in seen] == ([1, 2, 3, 3] if every_s == 0 else [0, 0, 0, 0])
    assert writes.count("status.json") == (2 + 3 if every_s == 0 else 2)
    assert json.loads((runs / "st" / "status.json").read_text())["status"] == "finished"


def test_cpu_training_runs_with_its_thread_count_and_restores_the_callers(runs: Path) -> None:
    import json

    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2
    seen: list[int] = []
    Trainer(tiny_cfg(runs, "name=threads", "train.max_steps=2", f"train.cpu_threads={wanted}")).fit(
        on_step=lambda t: seen.append(torch.get_num_threads()))
    assert seen == [wanted, wanted] and torch.get_num_threads() == before
    assert json.loads((runs / "threads" / "status.json").read_text())["cpu_threads"] == wanted  # recorded
