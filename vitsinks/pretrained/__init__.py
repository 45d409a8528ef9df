"""Any pretrained ViT: diagnose, intervene and edit unmodified timm, transformers and open_clip models, from a notebook.

`load("hf:...")` reads a model by one string with its preprocessing (`hub`); `adapt(model)` builds its `Backbone`
(`vitsinks.backbones`: one adapter per family, the blocks seen through views of the model's own modules, no weight
converted); `diagnose(model, images)` runs the diagnostics and returns tables (dicts of columns,
`pandas.DataFrame(...)`-ready), `report(model, images, out_dir)` the CLI's files, plots and page,
`intervene(model, images, ...)` the causal interventions (`api`); `fit_w8a8` / `apply_w8a8`, `register_neurons` /
`add_test_time_register`, `fit_massive` / `apply_massive` and `remove_edits` the post-hoc edits (`posthoc`).
See docs/pretrained.md.
"""

from vitsinks.backbones import (
    ADAPTERS,
    Adapter,
    AttentionView,
    Backbone,
    BlockView,
    LayerScaleView,
    adapt,
    adapter_for,
)
from vitsinks.pretrained.api import batch_size_for, diagnose, diagnose_fields, intervene, neuron_table, report, tables
from vitsinks.pretrained.edit_calls import (
    add_test_time_register,
    apply_massive,
    apply_w8a8,
    fit_massive,
    fit_w8a8,
    register_neurons,
    remove_edits,
)
from vitsinks.pretrained.hub import Loaded, load

__all__ = ["ADAPTERS", "Adapter", "AttentionView", "Backbone", "BlockView", "LayerScaleView", "Loaded",
           "add_test_time_register", "adapt", "adapter_for", "apply_massive", "apply_w8a8", "batch_size_for",
           "diagnose", "diagnose_fields", "fit_massive", "fit_w8a8", "intervene", "load", "neuron_table",
           "register_neurons", "remove_edits", "report", "tables"]
