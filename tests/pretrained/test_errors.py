"""Bad input to the notebook API gets one readable line (`BadValue`) before any work or file, and the post-hoc edits
neither stack nor stay: a second edit of a kind is refused, `remove_edits` gives the model its own forward back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.timm_models import CONFIGS, images, plant_sink, timm_vit
from vitsinks import pretrained
from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.pretrained import diagnose, intervene, report
from vitsinks.pretrained.edit_calls import (
    add_test_time_register,
    apply_massive,
    apply_w8a8,
    fit_massive,
    fit_w8a8,
    remove_edits,
)
from vitsinks.utils.errors import BadValue


@pytest.mark.parametrize(("call", "message"), [
    (lambda m, x: diagnose(m, torch.randn(2, 3, 40, 40)), "cannot embed inputs of shape"),  # built for 32 px
    (lambda m, x: diagnose(m, x[:, :1]), "cannot embed inputs of shape"),  # one channel
    (lambda m, x: diagnose(m, (x * 255).to(torch.uint8)), "not normalised floats"),
    (lambda m, x: diagnose(m, torch.where(x > 2, torch.nan, x)), "NaN or inf"),
    (lambda m, x: diagnose(m, x, heads=[7]), r"heads \[7\]"),
    (lambda m, x: diagnose(m, x, heads=[(5, 0)]), r"heads \[\(5, 0\)\]"),
    (lambda m, x: diagnose(m, x, heads=[]), r"heads \[\]"),
    (lambda m, x: diagnose(m, x, blocks=[2]), r"blocks \[2\]"),
    (lambda m, x: diagnose(m, x, batch_size=0), "batch_size=0"),
    (lambda m, x: diagnose(m, x, neurons="yes"), "neurons='yes'"),
    (lambda m, x: intervene(m, x, heads=[(1, 0)], foo=1), "intervene\\(\\) got foo"),
    (lambda m, x: fit_massive(m, x, massive=0), "massive=0"),
    (lambda m, x: intervene(m, x, heads=[(1, 0)], batch_size=0), "batch_size=0"),
    (lambda m, x: fit_w8a8(m, x, batch_size=0), "batch_size=0"),
    (lambda m, x: diagnose(m, x, heads=[(1, 0, 2)]), "no \\(block, head\\) pair"),
    (lambda m, x: diagnose(m.bfloat16(), x), "bfloat16 weights"),
    (lambda m, x: fit_w8a8(m, x, weight_bits=1), r"weight_bits=1 \(must be >= 2 and <= 16; the command line's quant"),
    (lambda m, x: fit_w8a8(m, x, act_bits=8.0), r"act_bits=8.0: give an integer"),
    (lambda m, x: diagnose(m, x, rules=SinkRules(eps=0.0)), r"rules.eps=0.0 \(must be > 0 and <= 0.5"),
    (lambda m, x: intervene(m, x, heads=[(1, 0)], top_k=-1), r"top_k=-1 \(must be >= 0; the command line's intervene"),
])
def test_bad_input_is_one_line(call, message: str) -> None:
    m, x = timm_vit(CONFIGS["deit"]), images(3)
    with pytest.raises(BadValue, match=message):
        call(m, x)


def test_empty_datasets_wrong_labels_and_settings_are_refused_before_any_work(tmp_path: Path) -> None:
    m, x = timm_vit(CONFIGS["deit"]), images(4)
    empty = TensorDataset(x[:0], torch.zeros(0))
    loader_answer = r"images must be a non-empty batch \(n, 3, H, W\), got shape \(0,\)"
    with pytest.raises(BadValue, match=loader_answer):
        diagnose(m, DataLoader(empty, batch_size=2))  # an empty loader: answered so before
    for call in (lambda: diagnose(m, empty), lambda: report(m, empty, tmp_path / "out"),
                 lambda: intervene(m, empty, heads=[(1, 0)])):
        with pytest.raises(BadValue, match=loader_answer):
            call()
    with pytest.raises(BadValue, match=r"eps=0.9 \(must be > 0 and <= 0.5; the command line's diagnostics.eps\)"):
        report(m, x, tmp_path / "out", settings=DiagnosticsConfig(eps=0.9))
    assert not (tmp_path / "out").exists()
    for labels, message in ((torch.zeros(3, dtype=torch.long), r"labels of shape \(3,\) for 4 images"),
                            (torch.zeros(4), "labels are torch.float32: give class indices")):
        with pytest.raises(BadValue, match=message):
            intervene(m, x, heads=[(1, 0)], edits=["zero_sink_value"], labels=labels)


def test_report_checks_shown_before_any_work(tmp_path: Path) -> None:
    m, x = timm_vit(CONFIGS["deit"]), images(2)
    channels_first = np.zeros((2, 3, 32, 32), dtype=np.uint8)
    with pytest.raises(BadValue, match=r"shown must be the images as uint8 RGB \(2, 32, 32, 3\)"):
        report(m, x, tmp_path / "out", shown=channels_first)
    assert not (tmp_path / "out").exists()


def test_the_page_of_a_pretrained_model_has_no_checkpoint_panels(tmp_path: Path) -> None:
    report(timm_vit(CONFIGS["deit"]), images(2), tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    assert 'id="maps"' in page and 'id="quant"' not in page and 'id="trainfree"' not in page


def test_intervene_takes_a_dataset_as_diagnose_does() -> None:
    m, x = timm_vit(CONFIGS["deit"]), images(4)
    plant_sink(m, 1, 0)
    want = intervene(m, x, heads=[(1, 0)], edits=["zero_sink_value"])["rows"]
    got = intervene(m, TensorDataset(x, torch.zeros(4)), heads=[(1, 0)], edits=["zero_sink_value"])["rows"]
    assert len(got["edit"]) == 4
    np.testing.assert_allclose(got["final_patch_relrms"], want["final_patch_relrms"], rtol=1e-6)


def test_load_is_the_package_function() -> None:
    assert callable(pretrained.load) and pretrained.load.__module__ == "vitsinks.pretrained.hub"


@torch.no_grad()
def test_edits_do_not_stack_and_come_off() -> None:
    m, x = timm_vit(CONFIGS["dinov2_reg"]), images(3)
    plain = m.forward_features(x)
    edited = add_test_time_register(m, [(0, 3)])
    with pytest.raises(BadValue, match="already carries a test-time register"):
        add_test_time_register(edited, [(0, 3)])
    with pytest.raises(BadValue, match="use the backbone add_test_time_register returned"):
        diagnose(m, x)  # the plain view would feed the hooks one token less
    assert diagnose(edited, x)["layout"]["num_registers"][0] == CONFIGS["dinov2_reg"]["reg_tokens"] + 1
    apply_massive(edited, fit_massive(edited, x))
    with pytest.raises(BadValue, match="already carries the massive-activation fix"):
        apply_massive(edited, fit_massive(edited, x))
    assert sorted(remove_edits(m)) == ["a test-time register", "the massive-activation fix"]
    torch.testing.assert_close(m.forward_features(x), plain, rtol=0, atol=0)  # its own forward again
    apply_w8a8(m, fit_w8a8(m, x))
    with pytest.raises(BadValue, match="already carries W8A8"):
        apply_w8a8(m, fit_w8a8(m, x))
    apply_massive(m, fit_massive(m, x))
    assert remove_edits(m) == ["the massive-activation fix"]  # W8A8 stays: its weights are quantised in place
    with pytest.raises(BadValue, match="already carries W8A8"):
        apply_w8a8(m, fit_w8a8(m, x))


def test_a_negative_block_counts_from_the_last_in_head_pairs() -> None:
    m, x = timm_vit(CONFIGS["deit"]), images(3)
    plant_sink(m, 1, 0)
    last = diagnose(m, x, blocks=[-1], heads=[(-1, 0)])["heads"]
    assert set(last["block"]) == {1} and set(last["head"]) == {0} and len(last["block"]) == 3
    got = intervene(m, x, heads=[(-1, 0)], edits=["zero_sink_value"])["rows"]
    want = intervene(m, x, heads=[(1, 0)], edits=["zero_sink_value"])["rows"]
    assert set(got["block"]) == {1}
    np.testing.assert_allclose(got["final_patch_relrms"], want["final_patch_relrms"], rtol=1e-6)


def test_report_never_deletes_the_users_files(tmp_path: Path) -> None:
    """The issue's case: `report(model, images, "notebook/")` on a folder of the user's is refused in one line with
    nothing written (not even a lock); in a report's own folder the user's files beside and inside survive a second
    report, while the first report's files that the second does not write (its plots) go."""
    from vitsinks.configs.schema import DiagnosticsConfig

    m, x = timm_vit(CONFIGS["deit"]), images(2)
    notebook = tmp_path / "notebook"
    (notebook / "photos").mkdir(parents=True)
    (notebook / "my_notes.txt").write_text("mine")
    (notebook / "photos" / "cat.jpg").write_bytes(b"\xff\xd8 a cat")
    with pytest.raises(BadValue, match=r"notebook holds files vitsinks did not write \(my_notes.txt, photos\): give "
                                       r"an empty or new folder for the diagnosis") as err:
        report(m, x, notebook)
    assert "\n" not in str(err.value)
    assert sorted(p.relative_to(notebook).as_posix() for p in notebook.rglob("*")) == [
        "my_notes.txt", "photos", "photos/cat.jpg"]
    out = tmp_path / "out"
    report(m, x, out)
    assert (out / "sink_heatmap.png").is_file()
    (out / "my_notes.txt").write_text("mine")
    (out / "photos").mkdir()
    (out / "photos" / "cat.jpg").write_bytes(b"\xff\xd8 a cat")
    report(m, x, out, settings=DiagnosticsConfig(plots=False))
    assert (out / "my_notes.txt").read_text() == "mine"
    assert (out / "photos" / "cat.jpg").read_bytes() == b"\xff\xd8 a cat"
    assert (out / "summary.json").is_file() and not list(out.glob("*.png"))  # the first report's plots are gone
