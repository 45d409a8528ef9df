"""The one upgrade path of saved configs (checkpoints' `config`, runs' config.yaml) onto today's schema, and the form
a run config is saved in (`saved`: its sections under the names saved files have always had, `SAVED_AS`)."""

from __future__ import annotations

from typing import Any, cast

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vitsinks.configs.schema import Config, to_container
from vitsinks.utils.errors import BadValue

RENAMED: dict[str, str] = {"protocol": "selection"}  # old dotted key -> its key now (add one when a key is renamed)
SAVED_AS: dict[str, str] = {"selection": "protocol"}  # a section saved under its earlier name (`saved`)
REMOVED: tuple[str, ...] = ("sweep",)  # retired fields, dropped (`sweep`: now `launch status sweep=...`'s argument)


def _pop(tree: dict[str, Any], key: str) -> tuple[bool, Any]:
    *parents, last = key.split(".")
    node: Any = tree
    for p in parents:
        node = node.get(p)
        if not isinstance(node, dict):
            return False, None
    return (True, node.pop(last)) if last in node else (False, None)


def _put(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
    tree[last] = value


def upgrade(old: dict[str, Any] | DictConfig | ListConfig, source: str = "a saved config") -> DictConfig:
    """A run's saved config on the current schema, typed like a composed config: renamed fields moved (`RENAMED`),
    retired ones dropped (`REMOVED`), fields added since at their defaults. Ranges are not checked; a key the schema
    does not know is a `BadValue` naming it and `source`."""
    tree = OmegaConf.to_container(OmegaConf.create(old) if not isinstance(old, DictConfig) else old, resolve=True)
    assert isinstance(tree, dict)
    tree = cast(dict[str, Any], tree)  # a config's keys are strings
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


def saved_names(tree: dict[str, Any]) -> dict[str, Any]:
    """A run config's sections (plain data) under their saved names (`SAVED_AS`), in their order."""
    return {SAVED_AS.get(k, k): v for k, v in tree.items()}


def saved(cfg: DictConfig) -> dict[str, Any]:
    """A run config as vitsinks saves it: resolved plain data, its sections under their saved names (`SAVED_AS`)."""
    return saved_names(to_container(cfg))


def saved_yaml(cfg: DictConfig) -> str:
    """`saved(cfg)` as the YAML of a config.yaml."""
    return OmegaConf.to_yaml(saved(cfg))
