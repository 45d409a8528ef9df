"""Where the Hydra configs are found: the user's `configs/` folders, layered over the package's own.

A user's folder holds config groups as the package does (`cluster/<name>.yaml`, `study/<name>.yaml`, ...): a file of
the same group and name as one of the package's replaces it, any other adds an option. The folders, first match wins:

1. `$VITSINKS_CONFIGS`: a folder from anywhere (or several, `:`-separated, the first winning); a folder it names that
   does not exist is an error naming it;
2. `./configs`, in the working directory;
3. the checkout's `configs/` (beside `vitsinks/`), when the package runs from a source checkout (an editable install);
4. the package's own `vitsinks/configs/`: the root config, every group's defaults, the shipped presets.

A non-editable install run from a folder without `configs/` finds the package's alone. Standard library only: `usage`
lists the options from here without importing Hydra (`schema.compose_config` gives Hydra the same folders).
"""

from __future__ import annotations

import os
from pathlib import Path

from vitsinks.utils.errors import InputNotFound

ENV = "VITSINKS_CONFIGS"
PACKAGE_CONFIGS = Path(__file__).resolve().parent
# a config group's earlier name -> its name; the command line and a user's folder still read the earlier one
# (`user_inputs.renamed_groups`, `user_inputs.renamed_user_groups`)
RENAMED_GROUPS = {"protocol": "selection"}
CHECKOUT = PACKAGE_CONFIGS.parents[1]  # the repository root when the package runs from a source checkout


def checkout_configs() -> Path | None:
    """The checkout's `configs/` when the package runs from a source checkout (its `pyproject.toml` names vitsinks);
    None for an installed package."""
    project = CHECKOUT / "pyproject.toml"
    if not (CHECKOUT / "configs").is_dir() or not project.is_file():
        return None
    return CHECKOUT / "configs" if 'name = "vitsinks"' in project.read_text() else None


def env_folders(strict: bool = True) -> list[Path]:
    """The folders `$VITSINKS_CONFIGS` names; one that does not exist is an `InputNotFound` (skipped when not
    `strict`)."""
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
    """The user's config folders, highest priority first: `$VITSINKS_CONFIGS`, `./configs`, the checkout's
    `configs/` (each once; see the module docstring)."""
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
    """Config group -> option -> the file that wins, over `folders` (default: `search_path(strict=False)`), groups
    and options sorted by name."""
    found: dict[str, dict[str, Path]] = {}
    for folder in reversed(folders if folders is not None else search_path(strict=False)):
        for yml in folder.glob("*/*.yaml"):
            found.setdefault(RENAMED_GROUPS.get(yml.parent.name, yml.parent.name), {})[yml.stem] = yml
    return {g: dict(sorted(found[g].items())) for g in sorted(found)}


def yaml_description(text: str) -> str:
    """The first comment block of a config file's `text` (without `@package` and without indented example lines):
    what the option is, as the docs and the model cards say it."""
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
