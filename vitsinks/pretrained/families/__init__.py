"""The adapter registry: one module per model family in this package, found and imported automatically.

An adapter is an `Adapter` subclass registered with `@register_adapter`. It recognises a model object of its family
(`matches`, by type: no weights are loaded, nothing is downloaded) and builds its `Foreign` view (`adapt`): the
block views, the embedding, the readout and the token layout located from the model's own config. `adapt(model)`
asks the adapters in registry order (`priority`, then name) and uses the first that matches.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import ClassVar

from torch import nn

from vitsinks.pretrained.views import Foreign
from vitsinks.utils.errors import BadValue


class Adapter:
    """Recognises one model family and views its models (see the package docstring)."""

    family: ClassVar[str]
    priority: ClassVar[int] = 100  # lower first: a subclass's adapter before its parent class's

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        raise NotImplementedError

    @classmethod
    def adapt(cls, model: nn.Module) -> Foreign:
        """The model's `Foreign` view; a `BadValue` naming what is not supported (a block or attention type)."""
        raise NotImplementedError


ADAPTERS: dict[str, type[Adapter]] = {}


def register_adapter(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: add an adapter to the registry under `cls.family`."""
    if cls.family in ADAPTERS:
        raise ValueError(f"adapter {cls.family!r} is registered twice")
    ADAPTERS[cls.family] = cls
    return cls


def adapter_for(model: nn.Module) -> type[Adapter]:
    """The first registered adapter (by priority, then family name) that recognises `model`."""
    for cls in sorted(ADAPTERS.values(), key=lambda a: (a.priority, a.family)):
        if cls.matches(model):
            return cls
    raise BadValue(f"no adapter recognises a {type(model).__module__}.{type(model).__name__}; the adapted families "
                   f"are {sorted(ADAPTERS)} (vitsinks.pretrained.families)")


def adapt(model: nn.Module) -> Foreign:
    """`model` (an unmodified pretrained ViT of an adapted family) seen through views (`Foreign`)."""
    return adapter_for(model).adapt(model)


for _info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
    importlib.import_module(f"{__name__}.{_info.name}")
