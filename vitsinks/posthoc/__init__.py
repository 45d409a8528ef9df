"""Training-free mitigations: post-hoc edits of a trained backbone, fitted on a few images (docs/trainfree.md).

Each is written once on the model seam (`vitsinks.models.seam.Backbone`) for every model family.

`test_time_register`, `mean_massive` and `zero_massive` register here on import; the quantization's edit is
registered by its own module (`vitsinks.quant`). `applied` records the edits a model carries (`remove_edits`).
`python -m vitsinks.trainfree` derives an edited run (`vitsinks.run.derive`) and analyses it.
"""

from vitsinks.posthoc import massive, test_time_register  # noqa: F401 - importing registers the methods
from vitsinks.posthoc.applied import remove_edits
from vitsinks.posthoc.method import METHODS, TrainFreeMethod, edited_variant, method, mitigations, reapply

__all__ = ["METHODS", "TrainFreeMethod", "edited_variant", "method", "mitigations", "reapply", "remove_edits"]
