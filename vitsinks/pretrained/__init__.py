"""Any pretrained ViT: diagnose and intervene on unmodified timm, transformers and open_clip models, from a notebook.

`load("hf:...")` reads a model by one string with its preprocessing (`hub`); `adapt(model)` views a model of an
adapted family (`families`, one module per family) as vitsinks' own blocks (`views`), without converting a weight;
`diagnose(model, images)` runs the diagnostics over the views and returns tables (dicts of columns,
`pandas.DataFrame(...)`-ready), `report(model, images, out_dir)` the CLI's files, plots and page,
`intervene(model, images, ...)` the causal interventions. `vitsinks.pretrained.edits`: W8A8, the test-time register
and the massive-activation fix through the views; `vitsinks.pretrained.neurons`: the register-neuron summary
(`diagnose(..., neurons=True)`).
See docs/pretrained.md.
"""

from vitsinks.pretrained.api import batch_size_for, diagnose, diagnose_fields, intervene, report, tables
from vitsinks.pretrained.families import ADAPTERS, Adapter, adapt, adapter_for, register_adapter
from vitsinks.pretrained.hub import Loaded, load
from vitsinks.pretrained.views import AttentionView, BlockView, Foreign, LayerScaleView

__all__ = ["ADAPTERS", "Adapter", "AttentionView", "BlockView", "Foreign", "LayerScaleView", "Loaded", "adapt",
           "adapter_for", "batch_size_for", "diagnose", "diagnose_fields", "intervene", "load", "register_adapter",
           "report", "tables"]
