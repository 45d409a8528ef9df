"""vitsinks: controlled ablations of attention-sink mitigations in Vision Transformers."""

import sys

__version__ = "0.1.0"

if sys.argv[:1] == ["-m"] and ("-h" in sys.argv or "--help" in sys.argv):
    # `python -m vitsinks.<command> --help`: answered from the command's source, before it imports torch
    from vitsinks.configs.usage import answer_help

    answer_help()
