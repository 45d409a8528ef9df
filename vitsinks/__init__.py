"""vitsinks: controlled ablations of attention-sink mitigations in Vision Transformers."""

__version__ = "0.1.0"
