"""The adapter registry: one `Adapter` per model family (`vitsinks.backbones`), registered with `@ADAPTERS.register`.
It recognises a model of its family by type (`matches`: nothing loaded or downloaded) and builds its `Backbone`
(`adapt`). `adapt(model)` uses the first adapter that matches, in registry order (`priority`, then name).
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from vitsinks.models.seam import Backbone
from vitsinks.utils.errors import BadValue
from vitsinks.utils.registry import Registry


class Adapter:
    """Recognises one model family and builds its models' `Backbone` (see the module docstring)."""

    family: ClassVar[str]
    priority: ClassVar[int] = 100  # lower first: a subclass's adapter before its parent class's

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        raise NotImplementedError

    @classmethod
    def adapt(cls, model: nn.Module) -> Backbone:
        """The model's `Backbone`; a `BadValue` naming what is not supported (a block or attention type)."""
        raise NotImplementedError


ADAPTERS: Registry[type[Adapter]] = Registry(
    "model family", "an `Adapter` registered with `@ADAPTERS.register` in a module of `plugins=` "
    "(docs/extending.md)", key="family", order="sorted")


def adapter_for(model: nn.Module) -> type[Adapter]:
    """The first registered adapter (by priority, then family name) that recognises `model`."""
    for cls in sorted(ADAPTERS.values(), key=lambda a: (a.priority, a.family)):
        if cls.matches(model):
            return cls
    raise BadValue(f"no adapter recognises a {type(model).__module__}.{type(model).__name__}; the adapted families "
                   f"are {', '.join(ADAPTERS)} (a new one is {ADAPTERS.where})")


def adapt(model: nn.Module | Backbone) -> Backbone:
    """`model` (a ViT of an adapted family) as a `Backbone`; a `Backbone` is returned as it is."""
    return model if isinstance(model, Backbone) else adapter_for(model).adapt(model)
