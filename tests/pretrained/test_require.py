"""`tests.helpers.requirements.require`: a missing optional library skips its tests, except under CI=true, where it
fails them."""

from __future__ import annotations

import pytest

from tests.helpers.requirements import require

MISSING = "vitsinks_no_such_module_for_the_test"


def test_missing_library_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        require(MISSING)


def test_missing_library_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"pip install -e '\.\[dev,hf,clip,mmseg\]'"):
        require(MISSING)


@pytest.mark.parametrize("ci", ["true", ""])
def test_present_library_is_returned(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    assert require("json").__name__ == "json"
