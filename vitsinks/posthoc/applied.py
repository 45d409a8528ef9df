"""Which post-hoc edits each model carries, with their hooks' handles: a second edit of a kind is refused (its hooks
would stack), `remove_edits` takes them off, `check_plain` refuses a model whose register only its backbone inserts."""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

from vitsinks.models.seam import Backbone
from vitsinks.utils.errors import BadValue

# Kept beside the model, not on it (a handle does not survive a copy): a deepcopy of an edited model copies its hooks
# but not this record, so edit the original or a fresh model.
APPLIED: weakref.WeakKeyDictionary[nn.Module, dict[str, list[Any]]] = weakref.WeakKeyDictionary()
VIEW_ONLY: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # models whose test-time register only a backbone inserts
LABELS = {"w8a8": "W8A8", "test_time_register": "a test-time register", "massive": "the massive-activation fix"}


def record(backbone: Backbone, edit: str, handles: list[Any], view_only: bool = False) -> None:
    """Note that the model carries `edit` by these hooks (`view_only`: inserted by its backbone's embedding only)."""
    APPLIED.setdefault(backbone.model, {})[edit] = handles
    if view_only:
        VIEW_ONLY.add(backbone.model)


def refuse_twice(backbone: Backbone, edit: str) -> None:
    """A `BadValue` when the model already carries this edit (`APPLIED`)."""
    if edit in APPLIED.get(backbone.model, {}):
        undo = ("its weights are quantised in place: load the model again" if edit == "w8a8" else
                "remove_edits(model) takes it off")
        raise BadValue(f"{backbone.name} already carries {LABELS[edit]}; a second would stack its hooks: {undo}")


def check_plain(model: nn.Module) -> None:
    """A `BadValue` when `model` carries a test-time register only its edited backbone inserts (one token more)."""
    if model in VIEW_ONLY and "test_time_register" in APPLIED.get(model, {}):
        raise BadValue(f"{type(model).__name__} carries a test-time register, whose hooks expect one token more: "
                       f"use the backbone add_test_time_register returned, or remove_edits(model)")


def remove_edits(model: nn.Module | Backbone) -> list[str]:
    """Take the test-time register and the massive-activation fix off the model (W8A8 stays); returns those removed."""
    module = model.model if isinstance(model, Backbone) else model
    applied = APPLIED.get(module, {})
    removed = [e for e in applied if e != "w8a8"]
    for e in removed:
        for h in reversed(applied.pop(e)):
            h.remove()
    VIEW_ONLY.discard(module)
    return [LABELS[e] for e in removed]
