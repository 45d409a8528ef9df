"""Shared fixtures: tiny configurations that train in seconds on a CPU."""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants as hf_constants
from omegaconf import DictConfig

from tests import preloaded
from vitsinks.configs.schema import load_config
from vitsinks.models import SinkViT, build_vit

# The one tiny ViT of the tests (2 blocks, 3 heads, 32 px in 8 px patches: 16 patches + [CLS]); `TINY` is a tiny
# run of it (config overrides), `tiny_vit` the model itself.
FIDELITY_TEST_ID = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")  # a test named in docs/fidelity.md
TINY_VIT = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 2, "num_heads": 3}
TINY = [
    "model=vit_cpu", *(f"model.{k}={v}" for k, v in TINY_VIT.items()),
    "views.global_size=32", "views.local_size=16", "views.n_local=2",
    "objective.proj_hidden=64", "objective.proj_out=32", "objective.slices=128",
    "data.image_size=32", "data.train_size=64", "data.val_size=32", "data.num_classes=4", "data.num_workers=0",
    "train.batch_size=16", "train.epochs=2", "train.log_every=1", "train.ckpt_every=3", "wandb.mode=disabled",
    "diagnostics.enabled=false", "eval.after_train=false",
]


def tiny_vit(**overrides) -> SinkViT:
    """`build_vit("vit_cpu", **TINY_VIT)` with `overrides` (any `build_vit` keyword)."""
    return build_vit("vit_cpu", **{**TINY_VIT, **overrides})


def tiny_cfg(runs: Path, *overrides: str) -> DictConfig:
    """A tiny run configuration under `runs`; later overrides win."""
    return load_config([*TINY, f"runs_dir={runs}", *overrides])


@pytest.fixture
def no_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The hub unreachable (a closed local port), offline mode not set, and an empty cache (returned)."""
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hf_constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    return tmp_path / "hub"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture(scope="session")
def sinktask_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`sinktask_run(into, exp, task, *overrides, name=...)`: a copy, at `into/name`, of a run of the ViT sink task
    `task` (`data=sinktask_<task>`, seed 0, no plots) trained by the real pipeline once per test session (the modules
    that use the same run share its training; each gets its own copy to write into)."""
    from vitsinks.train.trainer import Trainer

    cache, trained = tmp_path_factory.mktemp("sinktask_cache"), {}

    def get(into: Path, exp: str, task: str, *overrides: str, name: str | None = None) -> Path:
        key = (exp, task, *overrides)
        if key not in trained:
            cfg = load_config([f"exp={exp}", f"data=sinktask_{task}", f"runs_dir={cache}",
                               f"name=run{len(trained)}", "wandb.mode=disabled", "diagnostics.plots=false",
                               "seed=0", *overrides])
            trained[key] = Path(Trainer(cfg).fit()["run_dir"])
        dest = Path(into) / (name or exp)
        shutil.copytree(trained[key], dest)
        return dest

    return get


# A planted register neuron (used by the register-neuron and test-time register tests).
C0 = 0  # the channel only the planted token carries into the register block
PATCH = 5  # the planted patch (sequence index 1 + PATCH without registers)
UNIT = 17  # the planted MLP unit
THRESHOLD, GAIN, WRITE = 2.5, 8.0, 50.0  # unit fires above THRESHOLD in LayerNorm units; writes WRITE x median norm


def images(n: int = 8, seed: int = 0) -> torch.Tensor:
    """`n` seeded standard-normal images at the tiny ViT's size (n, 3, 32, 32)."""
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def plant_register_neuron(model: SinkViT, x: torch.Tensor, block: int = 1) -> SinkViT:
    """Edit `model` in place: channel C0 of the residual stream is 0 at every token but patch PATCH, where it holds
    6 x the typical per-channel spread (the stream measured on `x`), up to `block`; unit UNIT of `block` reads C0
    through its LayerNorm (it fires only at PATCH) and writes there a vector of WRITE x the median token norm."""
    model.eval()
    model.patch_embed.proj.weight[C0] = 0
    model.patch_embed.proj.bias[C0] = 0
    model.cls_token[..., C0] = 0
    model.pos_embed[..., C0] = 0
    for b in range(block + 1):
        blk = model.blocks[b]
        blk.attn.proj.weight[C0] = 0
        blk.attn.proj.bias[C0] = 0
        if b < block:
            blk.mlp.fc2.weight[C0] = 0
            blk.mlp.fc2.bias[C0] = 0
    t = model.embed_tokens(x)
    for blk in model.blocks[:block]:
        t = blk(t)
    spread = t.std().item()
    model.pos_embed[0, 1 + PATCH, C0] = 6 * spread
    blk = model.blocks[block]
    blk.mlp.fc1.weight[UNIT] = 0
    blk.mlp.fc1.weight[UNIT, C0] = GAIN
    blk.mlp.fc1.bias[UNIT] = -GAIN * THRESHOLD
    seen = {}
    handle = blk.mlp.act.register_forward_hook(lambda _m, _i, out: seen.update(a=out[:, 1 + PATCH, UNIT]))
    t = model.embed_tokens(x)
    for b in model.blocks[: block + 1]:
        t = b(t)
    handle.remove()
    median = t.norm(dim=-1).median().item()
    v = torch.randn(model.embed_dim, generator=torch.Generator().manual_seed(1))
    v[C0] = 0
    blk.mlp.fc2.weight[:, UNIT] = v / v.norm() * WRITE * median / seen["a"].mean().item()
    return model


def last_norms(model: SinkViT, x: torch.Tensor) -> torch.Tensor:
    """The token norms (B, N) at the output of the last block, before the final norm."""
    with torch.no_grad():
        t = model.embed_tokens(x)
        for blk in model.blocks:
            t = blk(t)
    return t.norm(dim=-1)


SLURM_BIN = Path(os.environ.get("VITSINKS_SLURM_DIR", "/tmp/vitsinks-slurm")) / "bin"
if SLURM_BIN.is_dir() and str(SLURM_BIN) not in os.environ.get("PATH", ""):
    os.environ["PATH"] = f"{SLURM_BIN}{os.pathsep}{os.environ.get('PATH', '')}"  # the local cluster's sacct


def require_slurm() -> None:
    """Skip without a responding SLURM, except under CI (CI=true), where a skip would hide a broken cluster."""
    import shutil
    import subprocess

    ok = shutil.which("sbatch") is not None and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0
    if not ok:
        reason = "no responding SLURM (start one: bash slurm/local-cluster.sh start)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI must run the SLURM tests")
        pytest.skip(reason)


def require_fashion_mnist() -> None:
    """Skip without the Debian package dataset-fashion-mnist, except under CI (CI=true), which installs it."""
    from vitsinks.data import FASHION_MNIST_ROOT

    if not Path(FASHION_MNIST_ROOT).is_dir():
        reason = "Debian package dataset-fashion-mnist absent (apt-get install dataset-fashion-mnist)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI must run the Fashion-MNIST tests")
        pytest.skip(reason)


@pytest.fixture
def figures(monkeypatch) -> list:
    """Every matplotlib figure saved during the test, in order, kept open so a test can read the data it draws."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    drawn: list[Figure] = []
    savefig = Figure.savefig

    def record(self: Figure, *args, **kwargs):
        drawn.append(self)
        return savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    monkeypatch.setitem(plt.rcParams, "figure.max_open_warning", 0)
    monkeypatch.setattr(plt, "close", lambda *args, **kwargs: None)
    return drawn


def bar_heights(ax) -> list[float]:
    """Heights of an axes' bars, in drawing order."""
    return [p.get_height() for p in ax.patches]


def run_command(args: Sequence[str], idle_s: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run a command to its end, capturing text stdout/stderr like `subprocess.run(capture_output=True, text=True)`;
    stop it only when it has written nothing for `idle_s` seconds (a hung command), never for being slow on a
    loaded machine: a command that keeps printing progress runs as long as it needs. `python -m` commands run in a
    fork of a preloaded interpreter (tests/preloaded.py), anything else in a fresh process."""
    args = list(args)
    env = os.environ if kwargs.get("env") is None else kwargs["env"]
    if (len(args) >= 3 and args[0] == sys.executable and args[1] == "-m" and set(kwargs) <= {"env", "cwd"}
            and preloaded.fits(env) and not os.environ.get("VITSINKS_TEST_FRESH")):
        return _run_preloaded(args, idle_s, dict(env), str(kwargs.get("cwd") or os.getcwd()))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}
    last = [time.monotonic()]

    def pump(stream, key: str) -> None:
        for piece in iter(lambda: os.read(stream.fileno(), 65536), b""):  # whatever arrived, \r progress bars too
            chunks[key].append(piece)
            last[0] = time.monotonic()

    threads = [threading.Thread(target=pump, args=(s, k), daemon=True) for s, k in ((proc.stdout, "out"),
                                                                                      (proc.stderr, "err"))]
    for th in threads:
        th.start()
    while proc.poll() is None:
        if time.monotonic() - last[0] > idle_s:
            proc.kill()
            raise subprocess.TimeoutExpired(args, idle_s, b"".join(chunks["out"]), b"".join(chunks["err"]))
        time.sleep(0.2)
    for th in threads:
        th.join()
    out, err = (b"".join(chunks[k]).decode(errors="replace") for k in ("out", "err"))
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _run_preloaded(args: list[str], idle_s: float, env: dict[str, str], cwd: str) -> subprocess.CompletedProcess:
    """`run_command` of `python -m module ...` in a fork of the preloaded interpreter (same watch for a hang)."""
    with tempfile.TemporaryDirectory(prefix="vitsinks-cmd-") as tmp:
        paths = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = preloaded.start(args[2], args[3:], env, cwd, *paths)
        last, seen = time.monotonic(), (0, 0)
        while True:
            with preloaded.lock:
                if not proc.is_alive():
                    break
            time.sleep(0.2)
            sizes = tuple(p.stat().st_size if p.exists() else 0 for p in paths)
            if sizes != seen:
                last, seen = time.monotonic(), sizes
            elif time.monotonic() - last > idle_s:
                with preloaded.lock:
                    proc.kill()
                    proc.join()
                out, err = (p.read_bytes() if p.exists() else b"" for p in paths)
                raise subprocess.TimeoutExpired(args, idle_s, out, err)
        out, err = (p.read_bytes().decode(errors="replace") if p.exists() else "" for p in paths)
    return subprocess.CompletedProcess(args, proc.exitcode, out, err)


def run_commands(commands: Sequence[Sequence[str]], idle_s: float = 300, **kwargs) -> list[subprocess.CompletedProcess]:
    """`run_command` of every command at once (their start-up, mostly imports, overlaps on the cores), results in
    the order given."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(commands))) as pool:
        return list(pool.map(lambda c: run_command(c, idle_s=idle_s, **kwargs), commands))


def run_module(module: str, *args: str, idle_s: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """`python -m module args...` through `run_command`."""
    return run_command([sys.executable, "-m", module, *args], idle_s=idle_s, **kwargs)



def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `fidelity` every test that docs/fidelity.md's table names (`pytest -m fidelity`: the fidelity check, each
    element of the table held against the reference's formula written out in its test)."""
    page = Path(__file__).resolve().parents[1] / "docs" / "fidelity.md"
    text = page.read_text() if page.is_file() else ""
    named = {f"{path}::{name}" for path, name in FIDELITY_TEST_ID.findall(text)}
    for item in items:
        if item.nodeid.split("[", 1)[0] in named:
            item.add_marker(pytest.mark.fidelity)
