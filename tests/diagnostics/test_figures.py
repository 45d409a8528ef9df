"""The figures of a diagnosis and of a run say their empty case in words, call a head a sink only where the rule
counts an event, draw each class in its one colour with its one label, carry colour bars where colour is a value,
and have no overlapping tick labels; the run page and training_curves.png show the training curves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_hex

from tests.helpers.diagnosed import BLOCK, HEAD, diagnosed, over_training_page
from tests.helpers.figures import overlapping_labels, texts
from vitsinks.backbones import adapt
from vitsinks.diagnostics import plots
from vitsinks.diagnostics.page import REPORT, TRAINING_PNG, checkpoint_report
from vitsinks.diagnostics.rules import CLASSES, SinkRules
from vitsinks.interventions.report import figure as interventions_figure
from vitsinks.objectives.monitors import KNN, RANKME
from vitsinks.utils.plotting import CLASS_COLORS, CLASS_LABELS, LOCATION_COLORS, log_axis, plt


@pytest.fixture(scope="module")
def planted() -> tuple:
    """A tiny model whose block 1 head 2 sends every query to one patch: a sink event on every image."""
    _, _, shown, d, summary = diagnosed()
    return shown, d, summary


def without_events(d: dict) -> dict:
    return {**d, "routed_frac": np.zeros_like(d["routed_frac"])}


def test_attention_maps_call_a_head_a_sink_only_where_the_rule_counts_an_event(planted, figures, tmp_path) -> None:
    shown, d, _ = planted
    plots.attention_maps(d, shown, tmp_path / "a.png")
    ev = SinkRules().events(d)
    fig = figures[-1]
    sinks = [ax for ax in fig.axes if ax.get_xlabel().startswith("sink on")]
    assert sinks and all(ax.get_xlabel().split(": ")[1].split("\n")[0] in CLASS_LABELS.values() for ax in sinks)
    assert len(sinks) == int(ev[:3, BLOCK, HEAD].sum())  # the planted head, once per image shown
    assert any(ax.get_title() == f"block {BLOCK} head {HEAD}" for ax in fig.axes)
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)  # colour is a value: its bar
    images = [ax for ax in fig.axes if ax.get_ylabel().startswith("image ")]
    assert [ax.get_ylabel() for ax in images] == ["image 0", "image 1", "image 2"]  # each image once
    plots.attention_maps(without_events(d), shown, tmp_path / "b.png")
    assert not [ax for ax in figures[-1].axes if ax.get_xlabel().startswith("sink on")]
    assert "no sink event (relaxed rule) in these images" in texts(figures[-1])


def test_empty_maps_say_so_in_words_instead_of_drawing_black(planted, figures, tmp_path) -> None:
    _, d, summary = planted
    plots.sink_heatmap(without_events(d), tmp_path / "h.png")
    freq, mass = figures[-1].axes[:2]
    assert not freq.images and "no sink event (relaxed rule) in any block or head" in texts(figures[-1])
    assert mass.images  # the mass moves before any event: always drawn, with its numbers
    quiet = {**summary, "sinks_per_image": {c: {k: 0.0 for k in v} for c, v in summary["sinks_per_image"].items()},
             "sinks_per_image_block0": {c: {k: 0.0 for k in v} for c, v in summary["sinks_per_image"].items()},
             "block_frequency": [0.0] * len(summary["block_frequency"])}
    plots.over_training([10, 20], [quiet, quiet], tmp_path / "o.png")
    fig = figures[-1]
    assert texts(fig).count("no sink event (relaxed rule) at any of the 2 checkpoints") == 2
    assert not fig.axes[1].images and fig.axes[2].images
    for name in ("sink_location_by_block",):
        plots.location_by_block(quiet | {"location_by_block": {k: [0.0] * 4 for k in LOCATION_COLORS},
                                         "class_by_block": {c: [0.0] * 4 for c in CLASSES}}, tmp_path / name)
        assert "no sink event (relaxed rule) in any block" in texts(figures[-1])


def test_each_class_has_its_one_label_and_colour(planted, figures, tmp_path) -> None:
    _, _, summary = planted
    plots.location_by_block(summary, tmp_path / "l.png")
    where, what = figures[-1].axes
    assert [t.get_text() for t in what.get_legend().get_texts()] == [CLASS_LABELS[c] for c in CLASSES]
    n = len(summary["class_by_block"]["nop"])
    assert [to_hex(what.patches[i * n].get_facecolor()) for i in range(len(CLASSES))] == \
        [CLASS_COLORS[c] for c in CLASSES]
    assert [to_hex(where.patches[i * n].get_facecolor()) for i in range(3)] == list(LOCATION_COLORS.values())
    plots.over_training([10, 20], [summary, summary], tmp_path / "o.png")
    lines = figures[-1].axes[0].lines[:len(CLASSES)]
    assert [(ln.get_label(), to_hex(ln.get_color())) for ln in lines] == [(CLASS_LABELS[c], CLASS_COLORS[c])
                                                                        for c in CLASSES]


def test_scatter_log_ticks_and_over_training_steps_do_not_collide(planted, figures, tmp_path) -> None:
    _, d, summary = planted
    plots.nop_broadcast_scatter(d, tmp_path / "s.png")
    assert not overlapping_labels(figures[-1])
    steps = list(range(0, 30_000, 1000))  # 30 checkpoints
    plots.over_training(steps, [summary] * len(steps), tmp_path / "o.png")
    assert not overlapping_labels(figures[-1])


def test_a_wide_log_x_axis_labels_only_what_fits() -> None:
    fig, ax = plt.subplots(figsize=(1.5, 2))
    ax.plot([1e-5, 0.1], [0, 1])
    log_axis(ax, [1e-5, 0.1], which="x")
    assert not overlapping_labels(fig)
    crowded, ax = plt.subplots(figsize=(1.5, 2))  # the check itself: labels that do run into each other
    ax.set_xticks(range(20), [f"label {i}" for i in range(20)])
    assert overlapping_labels(crowded)
    plt.close("all")


def test_the_interventions_legend_names_what_was_edited(figures, tmp_path) -> None:
    cell = {"n_heads": 1, "heads": ["all"], "final_patch_relrms": 0.01, "coherence": 0.9, "donor_cosine": float("nan")}
    summary = {"subject": "run/last (reg)", "n_images": 8, "min_class_events": 2,
               "by_class": {"whole model": {"model": {"drop_registers": cell}}}}
    interventions_figure([], summary, tmp_path / "i.png")
    fig = figures[-1]
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [CLASS_LABELS["model"]]
    assert "no donor or shuffle edit in this report" in texts(fig) and not overlapping_labels(fig)


def test_the_run_page_and_its_png_show_the_training_curves(tmp_path: Path, report: tuple,
                                                           figures: list) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [{"step": s, "loss": 1.0 / s, "probe_acc": 0.1 * s} for s in (1, 2, 3)] + \
        [{"step": 2, "val/probe_acc": 0.2, KNN: 0.4, RANKME: 6.0}, {"step": 3, "val/probe_acc": 0.25, KNN: 0.5,
                                                                   RANKME: 7.5}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    run = over_training_page(tmp_path, report)
    assert (run.diagnostics_root / TRAINING_PNG).stat().st_size > 5_000
    loss, probe, measures, rank = figures[-1].axes[:4]  # training_curves.png, drawn last
    assert loss.lines[0].get_ydata().tolist() == [1.0, 0.5, 0.333333]  # 6 significant digits, as report.json
    assert probe.lines[1].get_ydata().tolist() == [20.0, 25.0]  # validation top-1, in %
    assert probe.lines[2].get_ydata().tolist() == [40.0, 50.0] and "k-NN" in probe.get_title()  # the k-NN monitor
    assert rank.lines[0].get_xdata().tolist() == [2, 3] and rank.lines[0].get_ydata().tolist() == [6.0, 7.5]
    assert [ln.get_xdata().tolist() for ln in measures.lines][0] == [100, 200]
    page = (run.diagnostics_root / REPORT).read_text()
    assert "Training curves" in page
    assert "Last validation (step 3): online probe top-1 25%, k-NN top-1 50%, RankMe 7.5." in page
    (run_dir / "metrics.jsonl").unlink()  # an imported run: no metrics, said so
    over_training_page(tmp_path / "again", report)
    assert "no metrics.jsonl" in texts(figures[-1])


def test_a_block_without_register_neurons_says_why(tmp_path: Path) -> None:
    model, images, shown, d, summary = diagnosed()
    empty = {"by_block": [{"units": [], "scores": [], "norm_share": None}] * len(model.blocks)}
    summary = {**summary, "residual": {"register_neurons": empty}}  # at the default thresholds: k = 5
    page = checkpoint_report(adapt(model), images, shown, d, summary, tmp_path / "final", n_images=1).read_text()
    assert page.count("none: no patch token above 5 x its image&#x27;s median norm") == len(model.blocks)
