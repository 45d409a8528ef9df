"""Which post-hoc edits (`vitsinks.pretrained.edits`) each model carries, with their hooks' handles: a second edit
of a kind is refused (its hooks would stack), `edits.remove_edits` takes them off, and the API refuses to read a
model through a plain view while a test-time register's hooks expect the edited view's token count."""

from __future__ import annotations

import weakref

from torch import nn
from torch.utils.hooks import RemovableHandle

from vitsinks.pretrained.views import Foreign
from vitsinks.utils.errors import BadValue

# The edits applied to each model, with their hooks' handles: a second edit of a kind is refused (the hooks would
# stack), and `remove_edits` takes the hooks off. Kept beside the model, not on it (a handle does not survive a copy):
# a deepcopy of an edited model copies its hooks but not this record, so edit the original or a fresh model.
APPLIED: weakref.WeakKeyDictionary[nn.Module, dict[str, list[RemovableHandle]]] = weakref.WeakKeyDictionary()
LABELS = {"w8a8": "W8A8", "test_time_register": "a test-time register", "massive": "the massive-activation fix"}


def record(foreign: Foreign, edit: str, handles: list[RemovableHandle]) -> None:
    """Note that the model carries `edit`, by these hooks."""
    APPLIED.setdefault(foreign.model, {})[edit] = handles


def refuse_twice(foreign: Foreign, edit: str) -> None:
    """A `BadValue` when the model already carries this edit (`APPLIED`)."""
    if edit in APPLIED.get(foreign.model, {}):
        undo = ("its weights are quantised in place: load the model again" if edit == "w8a8" else
                "pretrained.edits.remove_edits(model) takes it off")
        raise BadValue(f"{foreign.name} already carries {LABELS[edit]}; a second would stack its hooks: {undo}")


def check_plain(model: nn.Module) -> None:
    """A `BadValue` when `model` carries a test-time register: its hooks expect the view that edit returned."""
    if "test_time_register" in APPLIED.get(model, {}):
        raise BadValue(f"{type(model).__name__} carries a test-time register, whose hooks expect one token more: "
                       f"use the view add_test_time_register returned, or pretrained.edits.remove_edits(model)")
