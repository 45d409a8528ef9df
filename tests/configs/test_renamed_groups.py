"""The image-selection group is `selection` (`selection=<name>`, `selection.<field>=`); its earlier name `protocol`
still works on the command line and as a user's config folder, with one warning line on stderr; and what a run saves
names the section `protocol`, as saved files always have (`configs.upgrade.saved`), read back by `upgrade`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.commands import run_module
from vitsinks.configs import search
from vitsinks.configs.schema import Config, load_config, to_container
from vitsinks.configs.upgrade import saved, saved_yaml, upgrade
from vitsinks.configs.user_inputs import renamed_groups
from vitsinks.utils.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_the_earlier_spelling_composes_as_the_new_one_with_one_warning_line(tmp_path: Path) -> None:
    new = run_module("vitsinks.intervene", "selection=kempner_causal", "selection.seed=3", "--cfg", "job", cwd=tmp_path)
    old = run_module("vitsinks.intervene", "protocol=kempner_causal", "protocol.seed=3", "--cfg", "job", cwd=tmp_path)
    assert new.returncode == old.returncode == 0, (new.stderr, old.stderr)
    assert old.stdout == new.stdout and "\nselection:\n  name: kempner_causal\n" in new.stdout
    assert "protocol" not in new.stderr
    assert old.stderr.splitlines() == ["warning: protocol=kempner_causal protocol.seed=3 is deprecated (`protocol` is "
                                       "now `selection`): write selection=kempner_causal selection.seed=3"]


def test_only_the_group_key_is_rewritten() -> None:
    given = ["+protocol.image_list=a.txt", "~protocol", "name=protocol=x", "protocolx=1", "diagnostics.protocol=1"]
    assert renamed_groups(given) == ["+selection.image_list=a.txt", "~selection", *given[2:]]


def test_a_users_folder_under_the_earlier_group_name_is_read_as_the_group(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture) -> None:
    mine = tmp_path / "my configs"
    (mine / "protocol").mkdir(parents=True)
    (mine / "protocol" / "mylist.yaml").write_text("# @package _global_\n# my images\nprotocol:\n  name: mylist\n"
                                                   "  seed: 7\ndiagnostics:\n  n_images: 5\n")
    (mine / "protocol" / "myorder.yaml").write_text("# the split's order\nname: myorder\norder: first\n")
    monkeypatch.setenv(search.ENV, str(mine))
    cfg = load_config(["protocol=mylist"])
    assert (cfg.selection.name, cfg.selection.seed, cfg.diagnostics.n_images) == ("mylist", 7, 5)
    assert load_config(["selection=myorder"]).selection.order == "first"
    assert {"mylist", "myorder", "kempner_causal"} <= set(search.options()["selection"])
    assert "protocol" not in search.options()
    err = capsys.readouterr().err
    assert f"warning: {mine.resolve() / 'protocol'}/ is the earlier name of the `selection` config group: move its " \
           f"files to {mine.resolve() / 'selection'}/" in err


def test_a_users_old_group_file_named_as_a_shipped_preset_is_refused_with_the_fix(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:
    mine = tmp_path / "mine"
    (mine / "protocol").mkdir(parents=True)
    (mine / "protocol" / "kempner_causal.yaml").write_text("name: kempner_causal\norder: first\n")
    monkeypatch.setenv(search.ENV, str(mine))
    with pytest.raises(ConfigError, match=r"ships its own selection=kempner_causal, which would win: move its files "
                                          rf"to {re.escape(str(mine.resolve() / 'selection'))}/"):
        load_config([])


@pytest.mark.parametrize("overrides", [[], ["selection=kempner_sinktable", "exp=gate+reg", "model=vit_small"]])
def test_a_saved_config_names_the_section_protocol_and_reads_back(overrides: list[str]) -> None:
    cfg = load_config(overrides)
    text = OmegaConf.to_yaml(cfg, resolve=True)
    assert saved_yaml(cfg) == re.sub(r"^selection:$", "protocol:", text, flags=re.M)  # the same bytes but the key
    tree = saved(cfg)
    assert list(tree) == [("protocol" if k == "selection" else k) for k in to_container(cfg)]
    assert to_container(upgrade(tree)) == to_container(cfg)


def test_the_committed_run_configs_read_their_selection() -> None:
    configs = sorted((ROOT / "eval").glob("**/inputs/*/config.yaml"))
    assert configs
    for path in configs[:: max(1, len(configs) // 8)]:
        on_disk = OmegaConf.load(path)
        assert to_container(upgrade(on_disk).selection) == OmegaConf.to_container(on_disk.protocol), path
        assert set(saved_yaml(upgrade(on_disk)).splitlines()) >= set(path.read_text().splitlines()), path


def test_no_shipped_config_uses_the_earlier_group_name() -> None:
    package = ROOT / "vitsinks" / "configs"
    assert not (package / "protocol").exists() and (package / "selection").is_dir()
    assert not [p for p in package.glob("**/*.yaml") if re.search(r"^protocol:|protocol=", p.read_text(), re.M)]
    assert "protocol" not in Config.__dataclass_fields__ and "selection" in Config.__dataclass_fields__
