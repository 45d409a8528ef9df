"""vitsinks.convert: a trusted file of data types becomes plain data; a file naming a function is never unpickled,
whatever `trust=true` says."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.malicious import plant
from vitsinks.convert import convert
from vitsinks.utils.errors import BadValue
from vitsinks.utils.safeload import UnsafeFile, torch_load


@pytest.mark.parametrize("fmt", ["zip", "legacy", "pickle"])
def test_a_hostile_file_is_refused_even_with_trust(tmp_path: Path, fmt: str) -> None:
    marker = tmp_path / "ran"
    src = plant(tmp_path / "evil.pt", marker, fmt)
    with pytest.raises(UnsafeFile, match="do not use this file"):
        convert(src, tmp_path / "out.pt")
    assert not marker.exists() and not (tmp_path / "out.pt").exists()


def test_data_types_become_plain_data_that_loads_weights_only(tmp_path: Path) -> None:
    key = np.arange(624, dtype=np.uint32) * 7919
    state = ("MT19937", key, 5, 0, 0.0)
    src = tmp_path / "old.pt"
    torch.save({"w": np.ones((2, 3), np.float32), "lr": Fraction(1, 4), "dir": Path("/data"), "rng": state,
                "tags": {"b", "a"}}, src)
    out = convert(src, None)
    assert out == src and (tmp_path / "old.pt.unsafe").is_file()  # in place, the original kept
    got = torch_load(src)
    assert torch.equal(got["w"], torch.ones(2, 3)) and got["lr"] == 0.25 and got["dir"] == "/data"
    assert got["tags"] == ["a", "b"] and got["rng"]["pos"] == 5
    assert np.array_equal(got["rng"]["key"].numpy().astype(np.uint32), key)


def test_an_array_of_objects_has_no_tensor_form(tmp_path: Path) -> None:
    src = tmp_path / "obj.pt"
    torch.save({"names": np.array(["a", "b"], dtype=object)}, src)
    with pytest.raises(BadValue, match="numpy array of object"):
        convert(src, tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()
