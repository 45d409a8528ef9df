"""The one way every figure is finished and written: tight layout, 110 dpi PNG, atomically, figure closed."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from vitsinks.utils import files  # noqa: E402


def save_figure(fig: plt.Figure, path: Path, title: str | None = None, title_size: int = 10) -> Path:
    """Add `title` (a suptitle), lay out, write `path` as PNG atomically and close the figure."""
    if title:
        fig.suptitle(title, fontsize=title_size)
    fig.tight_layout()
    with files.atomic_open(Path(path), "wb") as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
    return Path(path)
