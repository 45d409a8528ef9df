"""The one registry type: names from the item or given, one item per name, the lookup's one-line message, the
order, the config fields it checks and the user's modules (`plugins=`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vitsinks.configs.schema import compose_config
from vitsinks.utils.errors import BadValue, ConfigError
from vitsinks.utils.registry import FIELDS, Registry, import_plugins


class Base:
    name = ""


def test_a_class_is_registered_under_its_name_or_the_one_given() -> None:
    reg: Registry[type[Base]] = Registry("widget", "a `Base` registered with `@W.register`")

    @reg.register
    class Round(Base):
        name = "round"

    @reg.register(name="square")
    class Square(Base):
        pass

    reg.register(Base, name="plain")
    assert reg.get("round") is Round and reg["square"] is Square and Square.name == "square"
    assert reg.names() == ["round", "square", "plain"] and list(reg) == reg.names() and len(reg) == 3
    assert "round" in reg and "oval" not in reg
    assert reg.items() == [("round", Round), ("square", Square), ("plain", Base)]
    assert reg.unregister("plain") is Base and "plain" not in reg


def test_a_name_holds_one_item_and_the_same_item_again_changes_nothing() -> None:
    reg: Registry[type[Base]] = Registry("widget", "somewhere")
    first = reg.register(type("First", (Base,), {"name": "w"}))
    assert reg.register(first) is first and reg.names() == ["w"]
    with pytest.raises(BadValue, match=r"widget 'w' is registered twice \(.*First, .*Second\)"):
        reg.register(type("Second", (Base,), {"name": "w"}))
    with pytest.raises(BadValue, match="a widget needs a name: set its `name`"):
        reg.register(type("Nameless", (), {}))
    assert reg.get("w") is first


def test_an_unknown_name_is_one_line_with_the_names_and_where_to_add_one() -> None:
    reg: Registry[str] = Registry("fruit", "a string registered with `FRUIT.register`", order="sorted")
    for name in ("pear", "apple"):
        reg.register(name, name=name)
    assert reg.names() == ["apple", "pear"]  # sorted, not in registration order
    with pytest.raises(BadValue) as err:
        reg.get("plum")
    assert str(err.value) == ("unknown fruit 'plum': choose one of apple, pear; a new one is a string registered with "
                              "`FRUIT.register`")
    assert reg.unknown("plum", "basket.fruit").startswith("basket.fruit=plum is no registered fruit: choose one of")


def test_a_field_a_registry_names_is_checked_when_the_config_is_composed(monkeypatch: pytest.MonkeyPatch) -> None:
    reg: Registry[str] = Registry("tiny set", "nowhere")
    monkeypatch.setitem(FIELDS, "data.name", reg)  # data.name checked against this registry alone
    reg.register("synthetic", name="synthetic")
    from vitsinks.configs.checks import check_config

    check_config(compose_config([]))  # the default, registered
    with pytest.raises(ConfigError, match=r"data.name=imagenet is no registered tiny set: choose one of synthetic;"):
        check_config(compose_config(["data=imagenet"]))
    with pytest.raises(ValueError, match="data.name is already checked against the tiny sets"):
        Registry("other set", "nowhere", fields=("data.name",))


def test_plugins_are_imported_and_a_missing_one_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "vsx_plugin_mod.py").write_text("IMPORTED = True\n")
    (tmp_path / "vsx_broken_mod.py").write_text("import vsx_not_there\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import_plugins(["vsx_plugin_mod"])
        assert sys.modules["vsx_plugin_mod"].IMPORTED
        with pytest.raises(BadValue, match=r"plugins: no module vsx_absent on the Python path"):
            import_plugins(["vsx_absent"])
        with pytest.raises(ModuleNotFoundError, match="vsx_not_there"):  # the plugin's own error, as it is
            import_plugins(["vsx_broken_mod"])
    finally:
        for name in ("vsx_plugin_mod", "vsx_broken_mod"):
            sys.modules.pop(name, None)
