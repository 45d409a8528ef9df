"""Any pretrained ViT from a notebook: `load("hf:...")` reads a model by one string with its preprocessing (`hub`),
`adapt(model)` builds its `Backbone` (`vitsinks.backbones`), `diagnose` / `diagnose_fields` / `report` /
`intervene` run the diagnostics and the interventions (`api`), and `edit_calls` the post-hoc edits. See
docs/pretrained.md.
"""

from vitsinks.backbones import ADAPTERS, Adapter, AttentionView, Backbone, BlockView, LayerScaleView, adapt, adapter_for
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
