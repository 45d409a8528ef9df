"""Generations: a folder's files replaced as one, only those vitsinks wrote (its record, or an earlier version's
names), a folder of the user's refused, a generation killed at any point finished off by the next."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from vitsinks.utils import generations
from vitsinks.utils.errors import BadValue
from vitsinks.utils.generations import RECORD, Kind, claim, clear, generation

KIND = Kind("test report", marks=("data.npz",), legacy=("data.npz", "summary.json", "plot.png", "tables"),
            keep=("source.json", ".lock"), last="summary.json")


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path: bytes)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write(stage: Path, *names: str, tag: str = "") -> None:
    for name in names:
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        (stage / name).write_text(f"{tag} {name}")


def plant_users_files(folder: Path) -> dict[str, bytes]:
    """The user's notes beside vitsinks's files, a photo in a folder of theirs, a file in a folder vitsinks writes."""
    write(folder, "my_notes.txt", "photos/cat.jpg", "tables/mine.txt", tag="user's")
    return {k: v for k, v in tree(folder).items() if k in ("my_notes.txt", "photos/cat.jpg", "tables/mine.txt")}


def test_a_generation_replaces_only_the_files_the_earlier_one_wrote(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    with generation(folder, KIND) as stage:
        write(stage, "summary.json", "report.html", "plot.png", "tables/a.csv", tag="old")
    (folder / "source.json").write_text("kept")
    users = plant_users_files(folder)
    with generation(folder, KIND) as stage:
        write(stage, "summary.json", tag="new")
    assert tree(folder) == {**users, "source.json": b"kept", "summary.json": b"new summary.json",
                            RECORD: tree(folder)[RECORD]}
    assert json.loads((folder / RECORD).read_text()) == {"kind": "test report", "files": ["summary.json"]}
    with pytest.raises(RuntimeError), generation(folder, KIND) as stage:
        write(stage, "summary.json", "plot.png", tag="never")
        raise RuntimeError("interrupted")
    assert (folder / "summary.json").read_text() == "new summary.json" and not (folder / "plot.png").exists()
    assert not list(folder.glob(".gen-*"))


def test_a_folder_of_the_users_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    folder = tmp_path / "notebook"
    plant_users_files(folder)
    before = tree(folder)
    ran = []
    with pytest.raises(BadValue) as err, generation(folder, KIND) as stage:
        ran.append(stage)
    message = str(err.value)
    assert "\n" not in message and "give an empty or new folder" in message and "my_notes.txt" in message
    assert ran == [] and tree(folder) == before and sorted(p.name for p in folder.iterdir()) == [
        "my_notes.txt", "photos", "tables"]
    for fresh in (tmp_path / "new", tmp_path / "empty"):  # a new folder, an empty one, one with vitsinks's lock only
        (tmp_path / "empty").mkdir(exist_ok=True)
        assert claim(fresh, KIND) == set()
    (tmp_path / "empty" / ".lock").write_text("pid 1")
    assert claim(tmp_path / "empty", KIND) == set()


def test_a_folder_of_an_earlier_version_loses_only_the_names_vitsinks_wrote_there(tmp_path: Path) -> None:
    """No record: the marks tell an earlier version's folder; its names go (a folder of them with everything in
    it), the user's stay, and from then on the record holds."""
    folder = tmp_path / "old"
    write(folder, "data.npz", "plot.png", "summary.json", "tables/a.csv", tag="v0")
    write(folder, "my_notes.txt", "photos/cat.jpg", tag="user's")
    assert generations.written(folder, KIND) == {"data.npz", "plot.png", "summary.json", "tables/a.csv"}
    with generation(folder, KIND) as stage:
        write(stage, "data.npz", "summary.json", tag="v1")
    assert sorted(tree(folder)) == [RECORD, "data.npz", "my_notes.txt", "photos/cat.jpg", "summary.json"]
    assert (folder / "data.npz").read_text() == "v1 data.npz"
    assert generations.written(folder, KIND) == {"data.npz", "summary.json"}
    killed = tmp_path / "killed"  # an earlier version's first generation, killed before its data.npz moved in
    write(killed, ".gen-x1y2.tmp/data.npz", "plot.png", tag="v0")
    write(killed, "my_notes.txt", tag="user's")
    with generation(killed, KIND) as stage:
        write(stage, "summary.json", tag="v1")
    assert sorted(tree(killed)) == [RECORD, "my_notes.txt", "summary.json"]


def _killed_after_first_move(folder: Path) -> None:
    """In a child process: a generation that SIGKILLs itself when it is about to move its second file."""
    real = os.replace

    def replace(src: str | Path, dst: str | Path) -> None:
        if Path(dst).name == "b-new.txt":
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)

    os.replace = replace  # this process only: it dies in the block
    with generation(folder, KIND) as stage:
        write(stage, "a-new.txt", "b-new.txt", "summary.json", tag="killed")


def test_a_generation_killed_while_its_files_move_is_cleared_by_the_next(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    with generation(folder, KIND) as stage:
        write(stage, "old.txt", "summary.json", tag="first")
    users = plant_users_files(folder)
    child = multiprocessing.get_context("fork").Process(target=_killed_after_first_move, args=(folder,))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL
    assert (folder / "a-new.txt").is_file() and not (folder / "b-new.txt").exists()  # cut in the middle
    assert list(folder.glob(".gen-*.tmp"))  # its staging folder left behind
    assert generations.written(folder, KIND) >= {"old.txt", "summary.json", "a-new.txt", "b-new.txt"}
    with generation(folder, KIND) as stage:
        write(stage, "summary.json", tag="third")
    assert tree(folder) == {**users, "summary.json": b"third summary.json", RECORD: tree(folder)[RECORD]}


def test_a_file_of_the_users_where_a_new_file_goes_is_refused_before_any_file_moves(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    with generation(folder, KIND) as stage:
        write(stage, "summary.json", tag="first")
    (folder / "plot.png").write_text("the user's own plot")
    with pytest.raises(BadValue, match=r"plot.png was not written by vitsinks: move it"), \
            generation(folder, KIND) as stage:
        write(stage, "summary.json", "plot.png", tag="second")
    assert (folder / "plot.png").read_text() == "the user's own plot"
    assert (folder / "summary.json").read_text() == "first summary.json"


def test_another_kind_is_refused_and_clear_removes_only_the_recorded_files(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    with generation(folder, KIND) as stage:
        write(stage, "summary.json", "tables/a.csv", tag="first")
    other = Kind("other report", marks=(), legacy=())
    with pytest.raises(BadValue, match="holds vitsinks's test report, not its other report: give an empty or new"):
        claim(folder, other)
    users = plant_users_files(folder)
    clear(folder, KIND)
    assert {k: v for k, v in tree(folder).items() if k != RECORD} == users
    with generation(folder, KIND) as stage:  # still a folder of this kind: the next generation goes there
        write(stage, "summary.json", tag="next")
    with generation(tmp_path / "alone", KIND) as stage:
        write(stage, "summary.json", tag="alone")
    clear(tmp_path / "alone", KIND)
    assert not (tmp_path / "alone").exists()  # nothing else there: the folder goes too
    clear(tmp_path / "never", KIND)  # nothing there: nothing to do


def test_a_record_naming_files_outside_its_folder_is_refused_and_nothing_goes(tmp_path: Path) -> None:
    from vitsinks.utils.rundir import LEADERBOARD_FILES

    folder, precious = tmp_path / "board", tmp_path / "precious.txt"
    folder.mkdir()
    precious.write_text("mine")
    (folder / RECORD).write_text(json.dumps({"kind": "leaderboard", "files": ["../precious.txt"]}))
    with pytest.raises(BadValue, match=r"names files outside .*\.\./precious\.txt"), \
            generation(folder, LEADERBOARD_FILES) as stage:
        (stage / "leaderboard.md").write_text("new")
    assert precious.read_text() == "mine"


def test_a_users_folder_named_inputs_is_no_earlier_leaderboard(tmp_path: Path) -> None:
    from vitsinks.utils.rundir import LEADERBOARD_FILES

    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "my_data.csv").write_text("1,2")
    with pytest.raises(BadValue, match="holds files vitsinks did not write"):
        claim(tmp_path, LEADERBOARD_FILES)
    assert (tmp_path / "inputs" / "my_data.csv").read_text() == "1,2"
