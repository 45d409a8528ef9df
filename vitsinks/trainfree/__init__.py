"""Training-free mitigations: post-hoc edits of a trained backbone, fitted on a few images (docs/trainfree.md).

`test_time_register`, `mean_massive` and `zero_massive` register here on import; the quantization's edit is
registered by its own module. `python -m vitsinks.trainfree` derives an edited run and analyses it.
"""

from vitsinks.trainfree import massive, test_time_register  # noqa: F401 - importing registers the methods
from vitsinks.trainfree.base import METHODS, TrainFreeMethod, edited_variant, method, mitigations, register_method

__all__ = ["METHODS", "TrainFreeMethod", "edited_variant", "method", "mitigations", "register_method"]
