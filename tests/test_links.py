"""The docs' links: every relative link (Markdown, reference-style or HTML) in README.md, docs/, slurm/, eval/ and
configs/ READMEs resolves to a file or folder inside the repository, an anchor to a heading of its page; no doc names a
path outside the repository (a relative path that climbs above the checkout, or an absolute one under its parent
folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.links import ROOT, broken, outside_paths

DOCS = sorted({ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "slurm").rglob("README.md"),
               *(ROOT / "eval").rglob("README.md"), *(ROOT / "configs").rglob("README.md")})


def test_the_checker_finds_each_kind_of_broken_link(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "a.md").write_text("# Top\n\n## The `x` part\n\n## The `x` part\n")
    doc = repo / "README.md"
    doc.write_text("[ok](docs/a.md) [ok](docs/a.md#the-x-part) [ok](docs/a.md#the-x-part-1)\n"
                   "[multi\nline](docs/a.md#top) ![fig](docs) [web](https://example.org/x) [self](#here)\n"
                   '<a id="here"></a> `[in code](nowhere.md)`\n```\n[in a block](nowhere.md)\n```\n'
                   "[gone](docs/b.md) [bad anchor](docs/a.md#nope) [up](../elsewhere/NOTES.md)\n\n"
                   '[ref]: docs/missing.md\n<img src="docs/gone.png">\n')
    assert broken(doc, repo) == ["docs/b.md: no such file", "docs/a.md#nope: no heading #nope in docs/a.md",
                                 "../elsewhere/NOTES.md: outside the repository", "docs/missing.md: no such file",
                                 "docs/gone.png: no such file"]
    doc.write_text("see ../elsewhere/NOTES.md, or [the guide](../README.md) from docs/; "
                   f"`{tmp_path}/other/x.md`\n")
    assert outside_paths(doc, repo) == ["../elsewhere/NOTES.md", "../README.md", f"{tmp_path}/"]
    ours = f"{tmp_path}/made-by-a-script"  # a folder vitsinks' scripts make beside the checkout may be named ...
    doc.write_text(f"`export PATH={ours}/bin:$PATH`\n")
    assert outside_paths(doc, repo, own=[ours]) == [] and outside_paths(doc, repo, own=[]) == [f"{tmp_path}/"]
    doc.write_text(f"PATH={ours}/bin, then {tmp_path}/other/x.md\n")  # ... and does not excuse another
    assert outside_paths(doc, repo, own=[ours]) == [f"{tmp_path}/"]
    (repo / "docs" / "b.md").write_text("[the guide](../README.md) and ../README.md\n")
    assert broken(repo / "docs" / "b.md", repo) == [] and outside_paths(repo / "docs" / "b.md", repo) == []


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_link_resolves_inside_the_repository(doc: Path) -> None:
    assert broken(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_no_doc_names_a_path_outside_the_repository(doc: Path) -> None:
    assert outside_paths(doc) == []
