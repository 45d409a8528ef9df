"""The run directory: one writer at a time, atomic status, and what `launch status` makes of it."""

from __future__ import annotations

import ast
import inspect
import json
import os
import typing
from pathlib import Path

import pytest

from tests.helpers.tiny import tiny_cfg
from vitsinks.launch import status
from vitsinks.train.trainer import Trainer
from vitsinks.utils import files, rundir
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import RunDir, analyses_dir, holds, leaderboard_dir, model_folder, model_name
from vitsinks.utils.runstate import write_manifest


def test_a_second_writer_is_refused_and_the_first_ones_files_untouched(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "name=busy", "train.max_steps=1")).fit()
    before = {p: p.read_bytes() for p in (runs / "busy").rglob("*") if p.is_file() and p.name != ".lock"}
    holder = RunDir(runs / "busy")
    holder.lock()  # another process (an open file description) holds the run
    try:
        with pytest.raises(BadValue, match=rf"being written by pid {os.getpid()}.*name=\.\.\."):
            Trainer(tiny_cfg(runs, "name=busy", "train.max_steps=2")).fit()
    finally:
        holder.unlock()
    assert {p: p.read_bytes() for p in before} == before
    assert Trainer(tiny_cfg(runs, "name=busy", "train.max_steps=2")).fit()["step"] == 2  # free again


def test_status_json_is_all_or_nothing(tmp_path: Path, monkeypatch) -> None:
    rd = RunDir(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    rd.write_status("running", step=3)

    def full_disk(fd: int) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(files.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        rd.write_status("finished", step=10)
    assert json.loads((tmp_path / "status.json").read_text()) == {"status": "running", "step": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def _manifest(folder: Path, states: dict[str, str]) -> Path:
    entries = []
    for i, (name, state) in enumerate(states.items()):
        run = folder / name
        run.mkdir(parents=True)
        (run / "status.json").write_text(json.dumps({"status": state, "step": 4, "total_steps": 4}))
        entries.append({"index": i, "name": name, "run_dir": str(run), "job_id": None, "state": state})
    write_manifest(folder / "sweep" / "sweep.json", entries, sweep_dir=str(folder / "sweep"))
    return folder / "sweep"


def test_launch_status_exits_non_zero_when_a_run_failed(tmp_path: Path, capsys) -> None:
    assert status(str(_manifest(tmp_path / "ok", {"a": "finished", "b": "finished"}))) == 0
    assert status(str(_manifest(tmp_path / "bad", {"a": "finished", "b": "failed"}))) == 1
    assert "b (local) failed" in capsys.readouterr().out


def test_slurm_state_falls_back_to_the_runs_own_status(tmp_path: Path, monkeypatch) -> None:
    from vitsinks.run import slurm

    monkeypatch.setenv("PATH", str(tmp_path))  # no sacct at all
    assert slurm.job_state("4242_0", tmp_path, {"status": "finished"}) == "COMPLETED (status.json)"
    assert slurm.job_state("4242_1", tmp_path, {"status": "failed"}) == "FAILED (status.json)"
    assert slurm.job_state("4242_2", tmp_path) == "UNKNOWN"


def test_latest_summary_is_the_final_checkpoints_newest_diagnosis(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r")
    assert run.latest_summary() is None
    step = run.step_diagnostics(100) / "summary.json"
    step.parent.mkdir(parents=True)
    step.write_text("{}")
    assert run.latest_summary() == step  # only a step's diagnosis
    final, last = run.summary("final"), run.summary("last")
    for i, path in enumerate((final, last)):
        path.parent.mkdir(parents=True)
        path.write_text("{}")
        os.utime(path, ns=(10**18 + i, 10**18 + i))
    assert run.latest_summary() == last  # a later `diagnose ckpt=.../last.pt` wins over the after-training one
    os.utime(final, ns=(2 * 10**18, 2 * 10**18))
    assert run.latest_summary() == final


def test_a_file_system_without_flock_is_one_line_naming_it_and_the_fix(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def refuse(code: int) -> None:
        def flock(f: object, op: int) -> None:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr("fcntl.flock", flock)

    for code in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK):  # Lustre without -o flock, NFS without lockd
        refuse(code)
        with pytest.raises(BadValue, match=r"^the file system of .* does not support file locks .*Lustre.*: mount it "
                                           r"with flock, or set runs_dir=\.\.\. on a local or NFS file system$") as e:
            RunDir(tmp_path / "lustre").lock()
        assert "\n" not in str(e.value) and os.strerror(code) in str(e.value)
    refuse(errno.EIO)  # another failure is not reworded
    with pytest.raises(OSError, match=os.strerror(errno.EIO)) as e:
        RunDir(tmp_path / "lustre").lock()
    assert not isinstance(e.value, BadValue)


def test_a_model_that_is_not_a_run_is_named_alike_by_every_command(tmp_path: Path) -> None:
    weights = tmp_path / "some" / "folder" / "dinov2_reg.pth"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"w")
    assert model_name(str(weights), "cfgname") == "dinov2_reg"  # a file: its name without folders or suffix
    assert model_name("hf-hub:timm/vit_small.lvd142m", "x") == "hf-hub:timm_vit_small.lvd142m"
    assert model_name(str(tmp_path / "missing.pth"), "x") == str(tmp_path / "missing.pth").replace("/", "_")
    assert model_name(None, "cfgname") == "cfgname"


def test_a_model_folder_refuses_another_model_of_the_same_name(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "w.pth", tmp_path / "b" / "w.pth"
    for f in (a, b):
        f.parent.mkdir()
        f.write_bytes(f.parent.name.encode())
    folder = model_folder(tmp_path / "diagnostics", str(a), "cfg")
    assert folder == tmp_path / "diagnostics" / "w"
    assert json.loads((folder / "source.json").read_text()) == {"source": str(a.resolve())}
    (folder / "summary.json").write_text("a's")
    assert model_folder(tmp_path / "diagnostics", str(a), "cfg") == folder  # the same model again: its folder
    with pytest.raises(BadValue, match=rf"holds the results of {a.resolve()}, not of {b.resolve()}.*runs_dir="):
        model_folder(tmp_path / "diagnostics", str(b), "cfg")
    assert (folder / "summary.json").read_text() == "a's"
    assert json.loads((folder / "source.json").read_text()) == {"source": str(a.resolve())}
    assert model_folder(tmp_path / "other_runs", str(b), "cfg").parent == tmp_path / "other_runs"


def test_a_folder_with_only_its_record_is_taken_over_by_another_model(tmp_path: Path) -> None:
    """An attempt that was refused before it wrote a result leaves the record alone: it holds nothing to protect."""
    a, b = tmp_path / "a" / "w.pth", tmp_path / "b" / "w.pth"
    for f in (a, b):
        f.parent.mkdir()
        f.write_bytes(b"x")
    folder = model_folder(tmp_path / "quant", str(a), "cfg")
    assert model_folder(tmp_path / "quant", str(b), "cfg") == folder
    assert holds(folder, str(b)) and not holds(folder, str(a))


def test_a_loose_checkpoint_has_its_analyses_under_the_runs_folder_not_beside_the_file(tmp_path: Path) -> None:
    run_ckpt = tmp_path / "runs" / "r" / "checkpoints" / "step_0000010.pt"
    loose = tmp_path / "downloads" / "model.pt"
    for f in (run_ckpt, loose):
        f.parent.mkdir(parents=True)
        f.write_bytes(b"x")
    runs = tmp_path / "elsewhere"
    assert analyses_dir(run_ckpt, "diagnostics", runs) == tmp_path / "runs" / "r" / "diagnostics" / "step_0000010"
    assert analyses_dir(run_ckpt, "quant", runs) == tmp_path / "runs" / "r"  # its run holds results/quant.json
    folder = analyses_dir(loose, "interventions", runs)
    assert folder == runs / "interventions" / "model" and holds(folder, str(loose))
    assert not (tmp_path / "interventions").exists()  # not <file's folder>/../interventions


def test_a_refused_or_empty_locked_block_leaves_no_folder_behind(tmp_path: Path) -> None:
    deep = RunDir(tmp_path / "quant" / "w8a8")
    with deep.locked("wait"):
        assert (tmp_path / "quant" / "w8a8" / ".lock").is_file()
    assert not (tmp_path / "quant").exists()  # the folders the lock made, gone with it
    model = tmp_path / "diagnostics" / "weights"
    (model / "empty").mkdir(parents=True)
    (model / ".lock").write_text("pid 1 on elsewhere")
    (model / "source.json").write_text(json.dumps({"source": "/some/other/weights.pt"}))
    (tmp_path / "weights.pt").write_bytes(b"")  # another file of the same name, whose attempt there wrote nothing
    assert model_folder(tmp_path / "diagnostics", str(tmp_path / "weights.pt"), "weights") == model  # taken over


def test_the_layouts_paths_are_rundirs(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r")
    assert run.checkpoint("step_0000010") == run.step_checkpoint(10) == run.ckpt_dir / "step_0000010.pt"
    assert run.last == run.checkpoint("last")
    assert run.quantized("w8a8") == run.path / "quant" / "w8a8" and run.lock_file == run.path / ".lock"
    for step in (10, 20):
        run.step_diagnostics(step).mkdir(parents=True)
    run.summary("step_0000010").write_text("{}")
    (run.diagnostics_root / "step_x").mkdir()
    run.over_training("json").write_text("{}")
    assert run.step_diagnostics_dirs() == {10: run.step_diagnostics(10), 20: run.step_diagnostics(20)}
    assert leaderboard_dir(tmp_path / "runs") == tmp_path / "runs" / "leaderboard"
    assert leaderboard_dir(tmp_path / "sweep" / "sweep.json") == tmp_path / "sweep" / "leaderboard"


# --- RunDir is the one owner of the layout ------------------------------------------------------------------------
PACKAGE = Path(rundir.__file__).resolve().parents[1]
SAMPLE = {int: 1234567, str: "SAMPLE"}  # the arguments RunDir's methods are called with; parts naming them are not
PATH_CALLS = ("glob", "rglob", "joinpath", "with_name", "with_suffix", "Path", "PurePath", "join")
# a layout name the package may spell out, with why: (file under vitsinks/, the literal)
NOT_A_RUNS = {("pages/options_page.py", "config.yaml"): "the package's own Hydra config (configs/config.yaml)"}


def layout_names() -> set[str]:
    """The fixed folder and file names of a run's layout, as RunDir makes them: the parts of every path a RunDir
    property or method returns (under a sample run, with sample arguments) and rundir's named names (`SUMMARY`,
    `LOCK`, ...)."""
    root, names = Path("/RUN"), set()
    for _, member in inspect.getmembers(RunDir):
        fn = member.fget if isinstance(member, property) else member
        if not inspect.isfunction(fn) or typing.get_type_hints(fn).get("return") is not Path:
            continue
        hints = typing.get_type_hints(fn)
        args = [SAMPLE[hints.get(p, str)] for p in list(inspect.signature(fn).parameters)[1:]]
        path = fn(RunDir(root), *args)
        names |= {p for p in path.relative_to(root).parts if not any(str(a) in p for a in SAMPLE.values())}
    return names | {v for k, v in vars(rundir).items() if k.isupper() and isinstance(v, str)}


def _parts(node: ast.expr) -> list[str]:
    """The whole path parts a literal spells: a string's, or its pieces' in an f-string (a part glued to a value
    left out)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [p for p in node.value.split("/") if p]
    if not isinstance(node, ast.JoinedStr):
        return []
    out, values = [], node.values
    for i, v in enumerate(values):
        if isinstance(v, ast.Constant):
            parts = v.value.split("/")
            out += [p for p in parts[1 if i > 0 else 0:len(parts) - (i < len(values) - 1)] if p]
    return out


def spelled_paths(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, literal) of each layout name in `source` built into a path (`x / "name"`, `glob("*/name")`,
    `Path(x, "name")`, ...) or named as a constant (`LOCK = ".lock"`). Reading a path's name (`p.name == ...`) is
    not building one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        literals: list[ast.expr] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            literals = [node.left, node.right]
        elif isinstance(node, ast.Call):
            fn = node.func
            if (fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")) in PATH_CALLS:
                literals = list(node.args)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id.isupper() and isinstance(node.value, ast.Constant) and node.value.value in names:
            literals = [node.value]
        found += [(node.lineno, p) for lit in literals for p in _parts(lit) if p in names]
    return found


def test_the_layout_names_come_from_rundir() -> None:
    names = layout_names()
    assert {"config.yaml", "status.json", "metrics.jsonl", "checkpoints", "last.pt", "diagnostics", "interventions",
            "results", "quant", "summary.json", "per_image.npz", ".lock"} <= names
    assert not any(str(a) in n for n in names for a in SAMPLE.values())
    source = """
LOCK = ".lock"
a = run / "checkpoints" / "last.pt"
b = Path(run, "diagnostics")
c = run.glob(f"*/{SUMMARY}") + run.glob("*/config.yaml")
d = run / f"results/{kind}.json"
fine = [p.name == "checkpoints", "a run's config.yaml", out / f".{name}.lock", out / "by_head.csv", kind == "quant"]
"""
    assert sorted(spelled_paths(source, names)) == [(2, ".lock"), (3, "checkpoints"), (3, "last.pt"),
                                                    (4, "diagnostics"), (5, "config.yaml"), (6, "results")]


def test_no_module_builds_a_run_path_from_a_literal() -> None:
    """Every path of a run's layout is RunDir's (or rundir's names'): a module that spells one out again goes stale
    the day the layout changes."""
    names, found = layout_names(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "utils/rundir.py" or rel.startswith("configs/mmseg/"):
            continue
        found += [f"vitsinks/{rel}:{line}: {lit!r}" for line, lit in spelled_paths(path.read_text(), names)
                  if (rel, lit) not in NOT_A_RUNS]
    assert not found, "build these paths with RunDir (vitsinks/utils/rundir.py), not literals:\n" + "\n".join(found)
