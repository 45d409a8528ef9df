"""One meaning per word: no two modules of the package share a file name (`__init__.py` and `__main__.py` aside),
and no two test modules do, so that a file name says which idea it holds wherever it is read."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def shared_names(folder: Path, pattern: str) -> dict[str, list[str]]:
    """File name -> the files under `folder` of that name, for the names more than one file has."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(folder.rglob(pattern)):
        if path.name not in ("__init__.py", "__main__.py") and "__pycache__" not in path.parts:
            found[path.name].append(path.relative_to(folder.parent).as_posix())
    return {name: paths for name, paths in found.items() if len(paths) > 1}


@pytest.mark.parametrize(("folder", "pattern"), [("vitsinks", "*.py"), ("tests", "test_*.py")])
def test_no_two_modules_share_a_file_name(folder: str, pattern: str) -> None:
    assert shared_names(ROOT / folder, pattern) == {}


def test_a_shared_name_is_found(tmp_path: Path) -> None:
    for rel in ("pkg/a/views.py", "pkg/b/views.py", "pkg/a/__init__.py", "pkg/b/__init__.py", "pkg/c/crops.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert shared_names(tmp_path / "pkg", "*.py") == {"views.py": ["pkg/a/views.py", "pkg/b/views.py"]}
