"""A Markdown page's links and paths, checked: every relative link (Markdown, reference-style or HTML) resolves to a
file or folder inside the repository, an anchor to a heading of its page; no path outside the repository (a relative
path that climbs above the checkout, or an absolute one under its parent folder)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")  # [text](target "title")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)  # [label]: target
HTML = re.compile(r"\b(?:src|href)\s*=\s*[\"']([^\"']+)[\"']")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.M)
HTML_ID = re.compile(r"\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']")
PARENT_PATH = re.compile(r"(?<![\w/.~-])((?:\.\./)+[^\s)\]\"'`<>*,;]*)")
ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])(/[^\s)\]\"'`<>*,;:$]+)")
# The folders vitsinks' own scripts make outside the checkout (the local cluster's state, read from its script):
# a doc may name them wherever the checkout lives, /tmp included.
OWN = re.findall(r"VITSINKS_SLURM_DIR:-([^}]+)\}", (ROOT / "slurm" / "local-cluster.sh").read_text())


def prose(text: str) -> str:
    """`text` without fenced code blocks and inline code (links there are not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    """Every link target of a Markdown page."""
    body = prose(text)
    return [m.group(1) for rx in (LINK, REFERENCE, HTML) for m in rx.finditer(body)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text (code marks, emphasis and link syntax dropped) lower-cased, punctuation
    other than `-` and `_` removed, spaces as `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors a page offers: its headings' slugs (a repeated one as `-1`, `-2`, ...) and explicit HTML ids."""
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set(HTML_ID.findall(text))
    for heading in HEADING.findall(text):
        s = slug(heading)
        out.add(f"{s}-{seen[s]}" if s in seen else s)
        seen[s] = seen.get(s, 0) + 1
    return out


def broken(doc: Path, root: Path = ROOT, text: str | None = None) -> list[str]:
    """The links of `doc` (or of `text`, read as if it stood at `doc`) that do not resolve inside the repository
    `root`, each with why."""
    out = []
    for target in links(doc.read_text() if text is None else text):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.is_relative_to(root):
            out.append(f"{target}: outside the repository")
        elif not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no heading #{anchor} in {dest.relative_to(root)}")
    return out


def outside_paths(doc: Path, root: Path = ROOT, own: list[str] = OWN, text: str | None = None) -> list[str]:
    """Paths named anywhere in `doc` (code included) that lie outside the repository `root`: `../` paths that leave
    it, and any absolute path under the checkout's parent folder (a machine's path, even into the checkout) other
    than the folders of `own` (the parent folder is named once); `text`: read as if it stood at `doc`."""
    text = doc.read_text() if text is None else text
    out = [p for p in PARENT_PATH.findall(text) if not (doc.parent / p).resolve().is_relative_to(root)]
    parent = f"{root.parent.as_posix().rstrip('/')}/"
    machine = [p for p in ABSOLUTE_PATH.findall(text) if (p + "/").startswith(parent)
               and not any((p + "/").startswith(o.rstrip("/") + "/") for o in own)]
    return out + ([parent] if root.parent != Path(root.anchor) and machine else [])
