"""Print the results table of docs/pathway.md ("Study: the controlled broadcast task") from the committed study,
eval/pathway/broadcast_pathway.json: mean +- std over the seeds, the reference's 5-seed means in brackets.
tests/test_committed.py fails while the page's table differs from what this prints.
    python eval/pathway/table.py [eval/pathway/broadcast_pathway.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STUDY = Path(__file__).with_name("broadcast_pathway.json")
LABELS = {"attention": "attention only", "global": "+ global pathway", "global+pen": "+ global + penalty"}
HEADER = ("| arm | task MSE | sink inflow layer 1 / 2 | MSE cost of removing layer 2's pathway | ... of layer 2's "
          "attention |\n|---|---|---|---|---|")


def _cost(value: float | None) -> str:
    """A removal cost with the digits that show it: three decimals below 0.1, two above."""
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 0.1 else f"{value:.2f}"


def table(study: dict) -> str:
    """The markdown table of the study's arms."""
    rows = [HEADER]
    for i, (arm, label) in enumerate(LABELS.items()):
        ours, ref = study["arms"][arm], study["reference"][arm]
        ref_tag = "ref " if i == 0 else ""
        inflow = " / ".join(f"{v:.2f}" for v in ours["inflow"])
        ref_inflow = " / ".join(f"{v:.2f}" for v in ref["inflow"])
        pathway = ours.get("d_mse_no_pathway_layer2")
        pathway_cell = "-" if pathway is None else f"{_cost(pathway)} ({ref['d_mse_no_pathway_layer2']:.3g})"
        rows.append(f"| {label} | {ours['mse']:.3f} ± {ours['mse_std']:.3f} ({ref_tag}{ref['mse']:.3f}) | {inflow} "
                    f"({ref_tag}{ref_inflow}) | {pathway_cell} | {_cost(ours['d_mse_no_attention_layer2'])} "
                    f"({ref_tag}{ref['d_mse_no_attention_layer2']:.3g}) |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else STUDY).read_text())))
