"""Progress bars that honour `TQDM_DISABLE`: tqdm reads it only for arguments a call leaves out, and ours pass
`disable` (off on ranks other than 0, or when there is nothing to do)."""

from __future__ import annotations

import os


def hidden(off: bool = False) -> bool:
    """`disable=` for a tqdm bar: `off`, or `TQDM_DISABLE` set to a true value (1, true, yes)."""
    return off or os.environ.get("TQDM_DISABLE", "").strip().lower() in {"1", "true", "yes"}
