"""What a user types or writes that Hydra or the file system would answer with a traceback, answered in one line: a
config file that is not valid YAML (`yaml_named`), a non-ASCII value (`quote_unicode`, `unicode_fix`), a run name
the file system cannot hold (`name_problem`), and a config group under its earlier name (`renamed_groups`,
`renamed_user_groups`: read as today's, said once on stderr).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from vitsinks.configs.search import PACKAGE_CONFIGS, RENAMED_GROUPS, user_folders
from vitsinks.utils.errors import ConfigError

HOW_TO_QUOTE = "docs/commands.md, How arguments work"


@contextmanager
def yaml_named() -> Iterator[None]:
    """Around Hydra's composition: a config file that does not parse becomes a `ConfigError` (`broken_yaml`)."""
    try:
        yield
    except yaml.YAMLError as err:
        raise ConfigError(broken_yaml(err)) from None


def broken_yaml(err: yaml.YAMLError) -> str:
    """The one-line message of a config file that is not valid YAML: the file, the line, the problem and the package
    file it overrides."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = " ".join(str(getattr(err, "problem", None) or err).split())
    if mark is None:
        return f"a config file is not valid YAML ({problem}): fix it"
    path = Path(mark.name)
    return (f"{path}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML ({problem}); {overridden(path)}: "
            f"fix the file, or move it out of the configs folder")


def overridden(path: Path) -> str:
    """What the config file `path` stands for: the package file it replaces, or the option it adds."""
    resolved = path.resolve()
    if resolved.is_relative_to(PACKAGE_CONFIGS):
        return "a file of vitsinks' own configs"
    for folder in user_folders(strict=False):
        if resolved.is_relative_to(folder):
            rel = resolved.relative_to(folder)
            package = PACKAGE_CONFIGS / rel
            if package.is_file():
                return f"it overrides the package's vitsinks/configs/{rel.as_posix()}"
            return f"it adds the option {rel.parent.as_posix()}={rel.stem} (no package file of that name)"
    return "it is a config file Hydra read"


# characters of Hydra's override grammar that give a value structure: a value holding one is never quoted by vitsinks
GRAMMAR = set("[]{}()'\"\\=")
OVERRIDE = re.compile(r"^(?P<key>[+~]{0,2}[^=]+)=(?P<value>.*)$", re.S)


def quote_unicode(overrides: Sequence[str]) -> list[str]:
    """`overrides` with every unquoted value (each element of a comma sweep) that holds a non-ASCII character put in
    single quotes (`name=été` -> `name='été'`), which Hydra's grammar reads only inside quotes; values holding
    `GRAMMAR` characters are left as they are (`unicode_fix` answers Hydra's error)."""
    out = []
    for o in overrides:
        m = OVERRIDE.match(o)
        if m is None or m["value"].isascii() or GRAMMAR & set(m["value"]):
            out.append(o)
            continue
        parts = m["value"].split(",")
        out.append(f"{m['key']}=" + ",".join(p if p.isascii() else f"'{p.strip()}'" for p in parts))
    return out


def unicode_fix(overrides: Sequence[str]) -> str | None:
    """The one-line fix for the first override with a non-ASCII character, which Hydra refused (None: none has one)."""
    for o in overrides:
        if o.isascii():
            continue
        m = OVERRIDE.match(o)
        if m is None or not m["key"].isascii():
            return f"{o}: a key is ASCII: write it as the config names it ({HOW_TO_QUOTE})"
        return (f"{o}: Hydra reads a non-ASCII character only inside quotes: put each text that holds one in single "
                f"quotes (key='été', key=['été','ça']) and, in a shell, the whole argument in double quotes "
                f"({HOW_TO_QUOTE})")
    return None


# the most bytes vitsinks adds to a run's name in the names it gives folders: a sweep's suffix (`-<settings>`, at most
# 48 characters; `vitsinks.run.sweep.name_runs`) and a derived run's `@step_XXXXXXX+<method>` (`run.derive`)
NAME_SUFFIX = 1 + 48 + len("@step_0000000+") + 24
NAME_MAX = 255  # where the file system does not say (`os.pathconf` unavailable)


def name_max(folder: Path) -> int:
    """The longest file name, in bytes, the file system of `folder` (or of its nearest existing parent) holds."""
    here = folder.expanduser().absolute()
    while not os.path.isdir(here) and here != here.parent:  # isdir: False for a name too long to look up
        here = here.parent
    try:
        return int(os.pathconf(here, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return NAME_MAX


def name_problem(cfg: DictConfig) -> str | None:
    """Why `cfg.name`, as a run folder under `cfg.runs_dir`, cannot be held by the file system (its UTF-8 bytes plus
    `NAME_SUFFIX` over the file system's `name_max`), or None."""
    name = OmegaConf.select(cfg, "name", default=None, throw_on_missing=False)
    runs_dir = OmegaConf.select(cfg, "runs_dir", default=None, throw_on_missing=False)
    if not isinstance(name, str) or not isinstance(runs_dir, str):
        return None
    most = name_max(Path(runs_dir))
    if long := [part for part in Path(runs_dir).parts if len(part.encode()) > most]:
        return (f"runs_dir={runs_dir} has a folder name of {len(long[0].encode())} bytes, more than the {most} the "
                f"file system holds: give a shorter runs_dir=")
    limit = most - NAME_SUFFIX
    size = len(name.encode())
    if size <= limit:
        return None
    shown = name if len(name) <= 40 else name[:37] + "..."
    chars = f"{len(name)} characters, " if size != len(name) else ""
    return (f"name={shown} ({chars}{size} bytes: a run name holds at most {limit} bytes on the file system of "
            f"{runs_dir}, whose file names hold {limit + NAME_SUFFIX} and vitsinks adds up to {NAME_SUFFIX} to a run's "
            f"name; give a shorter name=)")


GROUP_KEY = re.compile(r"^(?P<prefix>[+~]{0,2})(?P<group>[A-Za-z_]\w*)(?=[.=@]|$)")  # an override's first key
_told: set[str] = set()


def tell_once(line: str) -> None:
    """`line` on stderr, once per process (a sweep composes each of its runs)."""
    if line not in _told:
        _told.add(line)
        print(line, file=sys.stderr)


def renamed_groups(overrides: Sequence[str]) -> list[str]:
    """`overrides` with a config group's earlier name (`search.RENAMED_GROUPS`: `protocol=...`, `protocol.<field>=`,
    `~protocol`) spelt as today (`selection=...`), told once on stderr."""
    out, old, new = [], [], []
    for o in overrides:
        m = GROUP_KEY.match(o)
        if m is not None and m["group"] in RENAMED_GROUPS:
            old.append(o)
            o = m["prefix"] + RENAMED_GROUPS[m["group"]] + o[m.end("group"):]
            new.append(o)
        out.append(o)
    if old:
        groups = ", ".join(f"`{a}` is now `{b}`" for a, b in RENAMED_GROUPS.items())
        tell_once(f"warning: {' '.join(old)} is deprecated ({groups}): write {' '.join(new)}")
    return out


def renamed_user_groups() -> None:
    """Every option a user's config folder keeps under a group's earlier name (`protocol/<name>.yaml`) registered as
    an option of the group, its `protocol:` section read as `selection:`, told once on stderr; one named as a shipped
    option is refused (the package's file would win)."""
    for old, new in RENAMED_GROUPS.items():
        for folder in reversed(user_folders(strict=False)):  # the first folder's option is stored last: it wins
            fix = (f"move its files to {folder / new}/ (and name a `# @package _global_` file's `{old}:` section "
                   f"`{new}:`)")
            for yml in sorted((folder / old).glob("*.yaml")):
                if (PACKAGE_CONFIGS / new / yml.name).is_file():
                    raise ConfigError(f"{yml}: the `{old}` config group is now `{new}`, and vitsinks ships its own "
                                      f"{new}={yml.stem}, which would win: {fix}")
                glob = "@package _global_" in yml.read_text()
                try:
                    with yml.open() as stream:  # a broken file's error names it
                        tree = yaml.safe_load(stream) or {}
                except yaml.YAMLError as err:
                    raise ConfigError(broken_yaml(err)) from None
                if glob and isinstance(tree, dict):
                    tree = {(new if k == old else k): v for k, v in tree.items()}
                ConfigStore.instance().store(group=new, name=yml.stem, node=tree, package="_global_" if glob else new)
                tell_once(f"warning: {folder / old}/ is the earlier name of the `{new}` config group: {fix}")
