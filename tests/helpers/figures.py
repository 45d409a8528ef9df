"""What a figure's readers need, checked from the renderer's own bounding boxes: no two tick labels of an axis
overlap, and no title or label runs into another or off the figure; and what a figure draws (its texts, its bars)."""

from __future__ import annotations

from itertools import combinations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Text


def _visible(texts: list[Text]) -> list[Text]:
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def overlapping_labels(fig: Figure) -> list[tuple[str, str]]:
    """The pairs of texts that overlap once the figure is drawn: tick labels of one axis, and the axes' titles among
    each other; and (text, "off the figure") for a title cut by the figure's edge."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found: list[tuple[str, str]] = []
    groups = [_visible(axis.get_ticklabels()) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)]
    titles = _visible([ax.title for ax in fig.axes] + [ax.xaxis.label for ax in fig.axes])
    for group in [*groups, titles]:
        boxes = [(t, t.get_window_extent(renderer)) for t in group]
        found += [(a.get_text(), b.get_text()) for (a, ba), (b, bb) in combinations(boxes, 2) if ba.overlaps(bb)]
    page = fig.bbox
    for t in _visible([ax.title for ax in fig.axes] + ([fig._suptitle] if fig._suptitle else [])):
        box = t.get_window_extent(renderer)
        if box.x0 < page.x0 - 1 or box.x1 > page.x1 + 1 or box.y1 > page.y1 + 1:
            found.append((t.get_text(), "off the figure"))
    return found


def texts(fig: Figure) -> str:
    """Every text the figure shows (titles, labels, notes, legends), one per line, each text's own line breaks
    (wrapping) read as spaces."""
    return "\n".join(" ".join(t.get_text().split()) for t in fig.findobj(Text) if t.get_visible())


def bar_heights(ax: Axes) -> list[float]:
    """Heights of an axes' bars, in drawing order."""
    return [p.get_height() for p in ax.patches]
