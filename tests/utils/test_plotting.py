"""The shared log axis: plain, readable labels whatever the spread of the values."""

from __future__ import annotations

import re

import pytest

from vitsinks.utils.plotting import log_axis, plt


@pytest.mark.parametrize("values", [[8.6, 8.7, 9.0, 8.8], [3.1, 3.1], [1.0, 7.0], [0.5, 2_000.0]],
                         ids=["barely-differ", "equal", "one-decade", "wide"])
def test_a_log_axis_shows_at_least_two_plain_labels_around_the_values(values: list[float]) -> None:
    fig, ax = plt.subplots()
    ax.plot(range(len(values)), values)
    log_axis(ax, values)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    labels = [t.label1.get_text() for t in ax.yaxis.get_major_ticks() if lo <= t.get_loc() <= hi]
    labels = [x for x in labels if x]
    plt.close(fig)
    assert lo <= min(values) and hi >= max(values)
    assert len(labels) >= 2, labels  # a scale to read the values against
    assert all(re.fullmatch(r"\d+(\.\d+)?", x) for x in labels), labels  # 9, 0.5, 1000: no 9x10^0
    assert not [t for t in ax.yaxis.get_minor_ticks() if t.label1.get_text()]  # no crowded minor labels
