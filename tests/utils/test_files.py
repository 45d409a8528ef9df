"""The disk layer: torn or foreign files read as one `BadFile`, refused writes as a `DiskFault`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.fsfaults import fill, small_fs
from vitsinks.utils import files
from vitsinks.utils.errors import UserError


def _torn(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def test_read_json_of_a_torn_file_names_it_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    files.write_json(path, {"a": [1, 2, 3], "b": "x" * 50})
    assert files.read_json(path, "rerun it") == {"a": [1, 2, 3], "b": "x" * 50}
    with pytest.raises(files.BadFile, match=r"summary.json is torn .*invalid JSON.*rerun it to write it again"):
        files.read_json(_torn(path), "rerun it")
    path.write_text("[1, 2]")  # valid JSON, not the object vitsinks writes
    with pytest.raises(files.BadFile, match="not an object"):
        files.read_json(path, "rerun it")
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(files.BadFile, match="not text"):
        files.read_json(path, "rerun it")
    assert issubclass(files.BadFile, UserError)


def test_read_jsonl_drops_a_torn_last_line_only(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    assert files.read_jsonl(path, "rerun") == [{"step": 1}, {"step": 2}]
    path.write_text('{"step": 1}\n{"ste\n{"step": 3}\n')
    with pytest.raises(files.BadFile, match="line 2"):
        files.read_jsonl(path, "rerun")


def test_read_npz_of_a_torn_or_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "per_image.npz"
    with files.atomic_open(path, "wb") as f:
        np.savez_compressed(f, x=np.arange(5000.0), y=np.ones((3, 4)))
    got = files.read_npz(path, "rerun diagnose")
    assert np.array_equal(got["x"], np.arange(5000.0)) and got["y"].shape == (3, 4)
    with pytest.raises(files.BadFile, match="per_image.npz is torn"):
        files.read_npz(_torn(path), "rerun diagnose")
    path.write_text("not an archive")
    with pytest.raises(files.BadFile, match="rerun diagnose"):
        files.read_npz(path, "rerun diagnose")


def test_read_csv_of_a_cut_table(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("run,kind,value\na,x,1\nb,y,2\n")
    assert [r["run"] for r in files.read_csv(path, "rerun", needs=("run", "value"))] == ["a", "b"]
    path.write_text("run,kind,value\na,x,1\nb,y")
    with pytest.raises(files.BadFile, match="cut short"):
        files.read_csv(path, "rerun")
    path.write_text("something,else\n1,2\n")
    with pytest.raises(files.BadFile, match="no column run"):
        files.read_csv(path, "rerun", needs=("run",))


def test_a_full_disk_is_a_disk_fault_and_the_old_file_stays(tmp_path: Path) -> None:
    with small_fs(tmp_path / "disk", 1024) as disk:
        path = disk / "last.pt"
        files.torch_save({"w": torch.arange(10)}, path)
        fill(disk, leave_kb=8)
        with pytest.raises(files.DiskFault, match=r"cannot write .*last.pt: no space left on the device"):
            files.torch_save({"w": torch.zeros(200_000)}, path)  # torch.save hides ENOSPC in a RuntimeError
        with pytest.raises(files.DiskFault, match="no space left"):
            files.write_text(disk / "big.txt", "x" * 100_000)
        assert torch.equal(torch.load(path)["w"], torch.arange(10))
        assert sorted(p.name for p in disk.iterdir()) == ["filler.bin", "last.pt"]  # no temp file left


def test_a_table_of_no_rows_reads_as_no_rows(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("edit,block,head\n")  # a shard that had nothing to edit
    assert files.read_csv(path, "rerun", needs=("edit",)) == []


def test_a_refused_read_is_named_without_the_advice_for_writes() -> None:
    import errno as errno_

    read = files.fault(PermissionError(errno_.EACCES, "Permission denied", "/data/x.pt"), doing="access")
    assert str(read).startswith("cannot access /data/x.pt: permission denied: check its permissions")
    write = files.fault(PermissionError(errno_.EACCES, "Permission denied"), "/runs/r/last.pt")
    assert str(write).startswith("cannot write /runs/r/last.pt: permission denied") and "runs_dir=" in str(write)
    assert files.fault(FileNotFoundError(errno_.ENOENT, "No such file")) is None  # not a fault of the disk


def test_a_lock_whose_file_was_removed_meanwhile_locks_the_new_file(tmp_path: Path) -> None:
    path = tmp_path / "run" / ".lock"
    first = files.FileLock(path, "the run", "wait").acquire()
    path.unlink()  # as RunDir.locked removes it before letting go
    first.release()
    second = files.FileLock(path, "the run", "wait").acquire()  # a new file: held for real
    try:
        with pytest.raises(files.BadFile.__mro__[1], match="is being written by"):  # BadValue
            files.FileLock(path, "the run", "wait").acquire()
    finally:
        second.release()
