"""Training-free mitigations: post-hoc edits of a trained backbone, fitted on a few images (docs/trainfree.md);
`test_time_register`, `mean_massive` and `zero_massive` register on import (W8A8: `vitsinks.quant`)."""

from vitsinks.posthoc import massive, test_time_register  # noqa: F401 - importing registers the methods
from vitsinks.posthoc.applied import remove_edits
from vitsinks.posthoc.method import METHODS, TrainFreeMethod, edited_variant, method, mitigations, reapply

__all__ = ["METHODS", "TrainFreeMethod", "edited_variant", "method", "mitigations", "reapply", "remove_edits"]
