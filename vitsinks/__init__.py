"""vitsinks: controlled ablations of attention-sink mitigations in Vision Transformers."""

from vitsinks.configs import early_help  # noqa: F401 - `python -m <command> --help`, answered before torch loads

__version__ = "0.1.0"
