"""One registry type for every open set of vitsinks (attention kinds, block mitigations, model families,
objectives, data sets, probe protocols, post-hoc methods, results): a name -> item table filled by a decorator.

    KINDS: Registry[type[AttentionKind]] = Registry("attention kind", "a module of vitsinks/models/kinds/")

    @KINDS.register  # named by the item's `name` attribute; or KINDS.register(item, name="mine")
    class Softmax(AttentionKind):
        name = "softmax"

`get` of an unknown name is a `BadValue` naming the value, the registered names and where a new one is added.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, Literal, TypeVar, overload

from vitsinks.utils.errors import BadValue

T = TypeVar("T")
Item = TypeVar("Item")  # the registered item, as the decorator returns it


class Registry(Generic[T]):
    """Items of one open set by name. `what`: what an item is, in messages ("data set"); `where`: how to add one.
    `fields`: the config keys whose value must be one of its names ("data.name"; checked by
    `vitsinks.configs.checks.check_config`, listed by the options page). `key`: the attribute an item names itself
    by. `order`: registration order, or sorted by name. `check`: called with each item before it is registered."""

    def __init__(self, what: str, where: str, *, fields: tuple[str, ...] = (), key: str = "name",
                 order: Literal["registration", "sorted"] = "registration",
                 check: Callable[[T], None] | None = None) -> None:
        self.what, self.where, self.fields, self.key, self.order, self.check = what, where, fields, key, order, check
        self._items: dict[str, T] = {}
        for field in fields:
            if FIELDS.setdefault(field, self) is not self:
                raise ValueError(f"config field {field} is already checked against the {FIELDS[field].what}s")

    @overload
    def register(self, item: Item, *, name: str | None = None) -> Item: ...

    @overload
    def register(self, item: None = None, *, name: str | None = None) -> Callable[[Item], Item]: ...

    def register(self, item: Item | None = None, *, name: str | None = None) -> Item | Callable[[Item], Item]:
        """Add `item` under `name` (default: its `key` attribute; an explicit name is set on a class). Also a
        decorator: `@R.register`, `@R.register(name="x")`; the same item again is a no-op."""
        if item is None:
            return lambda it: self.register(it, name=name)
        if name is not None and isinstance(item, type):
            setattr(item, self.key, name)
        found = name if name is not None else getattr(item, self.key, None)
        if not isinstance(found, str) or not found:
            raise BadValue(f"a {self.what} needs a name: set its `{self.key}` or pass register(..., name=...)")
        if self._items.get(found, item) is not item:
            raise BadValue(f"{self.what} {found!r} is registered twice ({_label(self._items[found])}, "
                           f"{_label(item)}): give the new one another {self.key}")
        if self.check is not None:
            self.check(item)  # type: ignore[arg-type]
        self._items[found] = item  # type: ignore[assignment]
        return item

    def unregister(self, name: str) -> T:
        """Remove `name` and return its item."""
        return self._items.pop(name)

    def get(self, name: str) -> T:
        """The item registered as `name`; an unknown name is a `BadValue` (`unknown`)."""
        if name not in self._items:
            raise BadValue(self.unknown(name))
        return self._items[name]

    __getitem__ = get

    def unknown(self, value: object, field: str | None = None) -> str:
        """The one-line message for an unregistered `value` of config key `field` (default: the first of `fields`)."""
        field = field or (self.fields[0] if self.fields else "")
        given = f"{field}={value} is no registered {self.what}" if field else f"unknown {self.what} {value!r}"
        return f"{given}: choose one of {', '.join(self.names()) or 'none'}; a new one is {self.where}"

    def names(self) -> list[str]:
        """The registered names, in the registry's order."""
        return sorted(self._items) if self.order == "sorted" else list(self._items)

    def items(self) -> list[tuple[str, T]]:
        """(name, item) pairs, in the registry's order."""
        return [(n, self._items[n]) for n in self.names()]

    def values(self) -> list[T]:
        """The items, in the registry's order."""
        return [self._items[n] for n in self.names()]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self.names())})"


FIELDS: dict[str, Registry] = {}  # config key -> the registry its value must be a name of (see `Registry.fields`)


def _label(item: object) -> str:
    """A registered item in messages: a class by its dotted name, anything else by its type's."""
    return f"{item.__module__}.{item.__qualname__}" if isinstance(item, type) else f"a {type(item).__name__}"


def import_members(package: str) -> None:
    """Import every module of `package` (sorted by name; not a `__main__`): a new member is one new module there."""
    path = importlib.import_module(package).__path__
    for info in sorted(pkgutil.iter_modules(path), key=lambda i: i.name):
        if info.name != "__main__":
            importlib.import_module(f"{package}.{info.name}")


def import_plugins(modules: Iterable[str]) -> None:
    """Import the modules `plugins=` names; one that is not there is a `BadValue` saying where Python looks."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name is None or not (name == err.name or name.startswith(f"{err.name}.")):
                raise  # the plugin itself imports something missing: its own error
            raise BadValue(f"plugins: no module {name} on the Python path (the folder a command runs from, or "
                           f"$PYTHONPATH): name a module as you would import it, e.g. plugins=[my_datasets] for "
                           f"./my_datasets.py") from None
