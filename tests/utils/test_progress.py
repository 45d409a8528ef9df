"""`utils.progress.hidden`: the bars of vitsinks' commands stay off under TQDM_DISABLE, as tqdm's own defaults do."""

from __future__ import annotations

import pytest
from tqdm import tqdm

from vitsinks.utils.progress import hidden


def drawn(capsys: pytest.CaptureFixture[str], disable: bool) -> str:
    for _ in tqdm(range(3), desc="work", disable=disable):
        pass
    return capsys.readouterr().err


@pytest.mark.parametrize("value", ["1", "true", "True", "yes"])
def test_tqdm_disable_hides_a_bar_whose_call_gives_disable(value: str, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TQDM_DISABLE", value)
    assert "work" in drawn(capsys, disable=False)  # tqdm alone: an explicit disable=False wins over the variable
    assert drawn(capsys, disable=hidden(False)) == ""


def test_without_it_the_bar_shows_on_rank_0_only(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert "work" in drawn(capsys, disable=hidden(False))
    assert drawn(capsys, disable=hidden(True)) == ""
    monkeypatch.setenv("TQDM_DISABLE", "0")
    assert "work" in drawn(capsys, disable=hidden(False))
