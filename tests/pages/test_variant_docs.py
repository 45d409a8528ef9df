"""The generated variant list of README.md and variant table of docs/variants.md (`python -m vitsinks.docs
variants`) against the exp config group they are generated from."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitsinks.configs.variants import variant_order
from vitsinks.pages import options_page as docs
from vitsinks.utils.errors import BadValue

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def variant_blocks() -> dict[str, str]:
    return docs.render_variants()


def test_the_committed_variant_list_and_table_are_what_the_code_writes() -> None:
    """For the variants the committed table lists: an exp file added since (a researcher's new variant: its module
    and exp file, nothing else) leaves the pages current; any other drift, or a listed variant gone, does not."""
    listed = docs.listed_variants((ROOT / "docs/variants.md").read_text())
    assert set(listed) <= set(variant_order()), f"listed variants without an exp file: run `{docs.VARIANTS_GENERATOR}`"
    blocks = docs.render_variants(only=listed)
    assert sorted(blocks) == sorted(docs.VARIANT_PAGES)
    for page, block in blocks.items():
        text = (ROOT / page).read_text()
        assert docs.replace_block(text, block, page) == text, f"{page}: stale variants: run `{docs.VARIANTS_GENERATOR}`"


def test_a_new_exp_file_leaves_the_pages_current_and_a_changed_one_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    order = variant_order()
    full = docs.render_variants()
    without = docs.render_variants(only=order[:-1])  # the pages as they were before the last variant existed
    assert docs.listed_variants(f"{docs.START}\n{without['docs/variants.md']}\n{docs.END}") == order[:-1]
    assert without != full  # regenerating adds it
    two = docs.render_variants(only=order[:2])
    rows = docs.variant_rows(order[:2])
    monkeypatch.setattr(docs, "variant_rows", lambda o=None: [[*rows[0][:-1], "changed"], *rows[1:]])
    assert docs.render_variants(only=order[:2]) != two  # a listed variant's row drifting is caught


def test_the_variant_table_has_one_row_per_exp_file_in_order(variant_blocks: dict[str, str]) -> None:
    rows = [line.split("|")[1].strip() for line in variant_blocks["docs/variants.md"].splitlines()
            if line.startswith("| `")]
    assert rows == [f"`{v}`" for v in variant_order()]
    listed = " ".join(variant_blocks["README.md"].split())
    assert [v for v in variant_order() if f"`{v}`" in listed] == variant_order()


def test_the_variants_command_rewrites_only_the_marked_blocks(tmp_path: Path, variant_blocks: dict[str, str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docs, "render_variants", lambda: variant_blocks)
    (tmp_path / "docs").mkdir()
    for page in docs.VARIANT_PAGES:
        (tmp_path / page).write_text(f"before\n{docs.START}\nstale\n{docs.END}\nafter\n")
    assert docs.write_variants(tmp_path) == [tmp_path / p for p in docs.VARIANT_PAGES]
    for page in docs.VARIANT_PAGES:
        assert (tmp_path / page).read_text() == f"before\n{docs.START}\n{variant_blocks[page]}\n{docs.END}\nafter\n"
    assert docs.write_variants(tmp_path) == []  # up to date: nothing written
    (tmp_path / "README.md").write_text(f"{docs.END}\n{docs.START}\n")
    with pytest.raises(BadValue, match=f"README.md needs one {docs.START} line"):
        docs.write_variants(tmp_path)
