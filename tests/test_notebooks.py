"""The notebooks of docs/notebooks: each runs to its end in a fresh kernel of this interpreter (nbclient), offline
(HF_HUB_OFFLINE=1) and in a temporary working directory, a cell's error failing the test; every figure a cell shows
comes back as a picture; each is committed without outputs, and points nowhere outside the repository."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.links import broken, outside_paths
from tests.helpers.requirements import require

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "docs" / "notebooks").glob("*.ipynb"))
IDS = [p.name for p in NOTEBOOKS]
CELL_TIMEOUT_S = 1800  # a hung cell, not a slow one: no cell of these notebooks comes near it on a loaded machine
SHOWS_A_PICTURE = ("plt.show()", "display(Image(")  # a cell with either must return an image/png output


def cells(path: Path, kind: str) -> list[str]:
    """The sources of the notebook's cells of `kind` (code, markdown)."""
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == kind]


def test_the_notebooks_are_there() -> None:
    assert "diagnose_pretrained.ipynb" in IDS
    for page in ("pretrained.md", "index.md"):
        assert "notebooks/diagnose_pretrained.ipynb" in (ROOT / "docs" / page).read_text(), page


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_a_notebook_is_committed_without_outputs(path: Path) -> None:
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and nb["metadata"]["kernelspec"]["language"] == "python"
    for i, c in enumerate(code):
        assert c["outputs"] == [] and c["execution_count"] is None, f"code cell {i} has outputs: clear them"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_a_notebook_points_nowhere_outside_the_repository(path: Path) -> None:
    markdown = "\n\n".join(cells(path, "markdown"))
    assert broken(path, text=markdown) == []
    everything = "\n".join([markdown, *cells(path, "code")])
    assert outside_paths(path, text=everything) == []
    assert "://" not in everything  # no web address: the repository's own pages say it all


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_a_notebook_runs_offline(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat, nbclient = require("nbformat"), require("nbclient")
    require("ipykernel")
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    # the kernel is this interpreter (a kernelspec of its own, so that no installed "python3" stands in for it)
    spec = tmp_path / "kernels" / "vitsinks-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "vitsinks tests", "language": "python"}))
    work = tmp_path / "work"
    work.mkdir()
    for name, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TMPDIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's own default, as a user's notebook has it
    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name="vitsinks-test",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")]))
    client = nbclient.NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, startup_timeout=600,
                                     resources={"metadata": {"path": str(work)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, at the first cell that fails
    for i, c in enumerate(c for c in nb.cells if c.cell_type == "code"):
        assert c.execution_count is not None, f"code cell {i} did not run"
        if any(s in c.source for s in SHOWS_A_PICTURE):
            assert any("image/png" in o.get("data", {}) for o in c.outputs), f"code cell {i} showed no picture"
