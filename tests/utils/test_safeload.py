"""utils.safeload: no file vitsinks reads runs the code it carries, and the refusal says what the file is."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from tests.helpers.malicious import plant, plant_numpy, plant_object
from vitsinks.utils.errors import BadFile
from vitsinks.utils.safeload import UnsafeFile, torch_load


@pytest.mark.parametrize("fmt", ["zip", "legacy", "pickle"])
def test_a_hostile_file_is_refused_in_one_line_and_nothing_runs(tmp_path: Path, fmt: str) -> None:
    marker = tmp_path / "ran"
    path = plant(tmp_path / "evil.pt", marker, fmt)
    with pytest.raises(UnsafeFile) as err:
        torch_load(path)
    assert not marker.exists()
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "system" in msg and "do not use this file" in msg
    assert "vitsinks.convert" not in msg  # never advised to unpickle a file that names os.system
    assert isinstance(err.value, BadFile)  # callers that recompute a torn cache recompute this one too


def test_the_planted_file_really_runs_code_when_unpickled(tmp_path: Path) -> None:
    """The fixture is potent: torch's unsafe load runs it (so the refusals above are what protects)."""
    marker = tmp_path / "ran"
    torch.load(plant(tmp_path / "evil.pt", marker), weights_only=False)
    assert marker.exists()


def test_a_checkpoint_of_an_earlier_vitsinks_is_named_and_given_the_conversion(tmp_path: Path) -> None:
    path = plant_numpy(tmp_path / "last.pt")
    with pytest.raises(UnsafeFile, match=r"earlier vitsinks .*numpy.*python -m vitsinks.convert file=.*last.pt "
                                         r"trust=true"):
        torch_load(path)


def test_other_objects_are_named_and_given_the_conversion(tmp_path: Path) -> None:
    path = plant_object(tmp_path / "w.pt")
    with pytest.raises(UnsafeFile, match=r"fractions.Fraction.*nothing was loaded or run.*vitsinks.convert"):
        torch_load(path)


def test_plain_content_and_timm_style_namespaces_load(tmp_path: Path) -> None:
    obj = {"model": {"w": torch.arange(3.0)}, "args": argparse.Namespace(lr=0.1), "rng": (3, (1, 2), None)}
    torch.save(obj, tmp_path / "ok.pt")
    got = torch_load(tmp_path / "ok.pt")
    assert torch.equal(got["model"]["w"], obj["model"]["w"]) and got["args"].lr == 0.1 and got["rng"] == obj["rng"]


class _Timed:
    """Unpickled, it runs code through a function outside any list of dangerous modules (`timeit.timeit`)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        import timeit

        return timeit.timeit, (f"open({str(self.marker)!r}, 'w')",), None


class ScriptConfig:
    """A training script's own class, as third-party checkpoints carry them."""


@pytest.mark.parametrize("payload", ["timeit", "class"])
def test_only_data_types_are_ever_offered_the_conversion(tmp_path: Path, payload: str) -> None:
    marker = tmp_path / "ran"
    obj = _Timed(marker) if payload == "timeit" else ScriptConfig()
    torch.save({"w": torch.zeros(2), "x": obj}, tmp_path / "w.pt")
    with pytest.raises(UnsafeFile) as err:
        torch_load(tmp_path / "w.pt")
    msg = str(err.value)
    assert "timeit.timeit" in msg if payload == "timeit" else "ScriptConfig" in msg
    assert "vitsinks.convert" not in msg and "nothing was loaded or run" in msg and not marker.exists()
