"""The one upgrade path of saved configs (checkpoints' `config`, runs' config.yaml) written by older versions: onto
today's schema (`vitsinks.configs.schema.Config`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vitsinks.configs.schema import Config
from vitsinks.utils.errors import BadValue

RENAMED: dict[str, str] = {}  # old dotted key -> its current key; add an entry when a field is renamed
REMOVED: tuple[str, ...] = ("sweep",)  # retired fields, dropped (`sweep`: now `launch status sweep=...`'s argument)


def _pop(tree: dict[str, Any], key: str) -> tuple[bool, Any]:
    *parents, last = key.split(".")
    for p in parents:
        tree = tree.get(p)
        if not isinstance(tree, dict):
            return False, None
    return (True, tree.pop(last)) if last in tree else (False, None)


def _put(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
    tree[last] = value


def upgrade(old: Mapping[str, Any] | DictConfig, source: str = "a saved config") -> DictConfig:
    """A run's saved config on the current schema: renamed fields moved (`RENAMED`), retired ones dropped
    (`REMOVED`), fields added since at the schema's defaults (the values older code had), typed like a composed
    config, so code reads it by attribute without defaults. Ranges are not checked (an old run stays readable);
    a key the schema does not know is a `BadValue` naming it and `source`."""
    tree = OmegaConf.to_container(OmegaConf.create(old) if not isinstance(old, DictConfig) else old, resolve=True)
    assert isinstance(tree, dict)
    for before, now in RENAMED.items():
        found, value = _pop(tree, before)
        if found:
            _put(tree, now, value)
    for key in REMOVED:
        _pop(tree, key)
    try:
        return OmegaConf.merge(OmegaConf.structured(Config), tree)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        raise BadValue(f"{source} does not fit this version's config schema: {str(err).splitlines()[0]}") from None
