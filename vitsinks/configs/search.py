"""Where the Hydra configs are found, first match winning: `$VITSINKS_CONFIGS` (folders, `:`-separated), `./configs`,
the checkout's `configs/` (a source checkout), then the package's own `vitsinks/configs/`. A user's folder holds config
groups as the package does: a file of the same group and name replaces the package's, any other adds an option.
Standard library only (`usage` lists the options without importing Hydra).
"""

from __future__ import annotations

import os
from pathlib import Path

from vitsinks.utils.errors import InputNotFound

ENV = "VITSINKS_CONFIGS"
PACKAGE_CONFIGS = Path(__file__).resolve().parent
# a config group's earlier name -> its name, still read on the command line and in a user's folder (`user_inputs`)
RENAMED_GROUPS = {"protocol": "selection"}
CHECKOUT = PACKAGE_CONFIGS.parents[1]  # the repository root when the package runs from a source checkout


def checkout_configs() -> Path | None:
    """The checkout's `configs/` when the package runs from a source checkout, else None."""
    project = CHECKOUT / "pyproject.toml"
    ours = (CHECKOUT / "configs").is_dir() and project.is_file() and 'name = "vitsinks"' in project.read_text()
    return CHECKOUT / "configs" if ours else None


def env_folders(strict: bool = True) -> list[Path]:
    """The folders `$VITSINKS_CONFIGS` names; a missing one is an `InputNotFound` (skipped when not `strict`)."""
    found = []
    for entry in filter(None, os.environ.get(ENV, "").split(os.pathsep)):
        folder = Path(entry).expanduser().resolve()
        if folder.is_dir():
            found.append(folder)
        elif strict:
            raise InputNotFound(f"{ENV}={os.environ[ENV]}: no folder {folder} (set it to a folder of config groups, "
                                f"e.g. one holding cluster/<name>.yaml, or unset it)")
    return found


def user_folders(strict: bool = True) -> list[Path]:
    """The user's config folders, highest priority first (see the module docstring)."""
    here = Path.cwd() / "configs"
    candidates = [*env_folders(strict), *([here.resolve()] if here.is_dir() else []), checkout_configs()]
    out: list[Path] = []
    for folder in candidates:
        if folder is not None and folder.resolve() not in out and folder.resolve() != PACKAGE_CONFIGS:
            out.append(folder.resolve())
    return out


def search_path(strict: bool = True) -> list[Path]:
    """Every config folder, highest priority first: the user's, then the package's."""
    return [*user_folders(strict), PACKAGE_CONFIGS]


def options(folders: list[Path] | None = None) -> dict[str, dict[str, Path]]:
    """Config group -> option -> the file that wins over `folders` (default: every config folder), sorted by name."""
    found: dict[str, dict[str, Path]] = {}
    for folder in reversed(folders if folders is not None else search_path(strict=False)):
        for yml in folder.glob("*/*.yaml"):
            found.setdefault(RENAMED_GROUPS.get(yml.parent.name, yml.parent.name), {})[yml.stem] = yml
    return {g: dict(sorted(found[g].items())) for g in sorted(found)}


def yaml_description(text: str) -> str:
    """The first comment block of a config file's `text` (without `@package` and indented example lines)."""
    out: list[str] = []
    for line in text.splitlines():
        if "@package" in line:
            continue
        if not line.startswith("#") or line.startswith("#  ") or not line.strip("# "):
            if out:
                break
            continue
        out.append(line.lstrip("#").strip())
    return " ".join(out)
