"""Shared fixtures (the helpers that tests import are in tests/helpers/)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from huggingface_hub import constants as hf_constants

from vitsinks.configs.schema import load_config

# the helpers' asserts explain a failure as a test's own do (registered before any test module imports them)
pytest.register_assert_rewrite("tests.helpers")

FIDELITY_TEST_ID = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")  # a test named in docs/fidelity.md


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


SLURM_BIN = Path(os.environ.get("VITSINKS_SLURM_DIR", "/tmp/vitsinks-slurm")) / "bin"
if SLURM_BIN.is_dir() and str(SLURM_BIN) not in os.environ.get("PATH", ""):
    os.environ["PATH"] = f"{SLURM_BIN}{os.pathsep}{os.environ.get('PATH', '')}"  # the local cluster's sacct


@pytest.fixture
def cpu_flex_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let FlexAttention's eager reference run its backward on CPU: torch refuses it through the public API; lifting
    the refusal (`_validate_device`) runs the eager reference's own backward (the score mod's joint graph, the
    log-sum-exp's gradient), which checks a kind's FlexAttention construction without a GPU."""
    import torch.nn.attention.flex_attention as flex_module

    monkeypatch.setattr(flex_module, "_validate_device", lambda *tensors: None)


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `fidelity` every test that docs/fidelity.md's table names (`pytest -m fidelity`: the fidelity check, each
    element of the table held against the reference's formula written out in its test)."""
    page = Path(__file__).resolve().parents[1] / "docs" / "fidelity.md"
    text = page.read_text() if page.is_file() else ""
    named = {f"{path}::{name}" for path, name in FIDELITY_TEST_ID.findall(text)}
    for item in items:
        if item.nodeid.split("[", 1)[0] in named:
            item.add_marker(pytest.mark.fidelity)
