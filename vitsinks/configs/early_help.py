"""Imported by `vitsinks/__init__.py`: `python -m vitsinks.<command> --help` is answered here, from the command's
source (`usage.answer_help`), before the command module imports torch; any other import does nothing."""

import sys

if sys.argv[:1] == ["-m"] and ("-h" in sys.argv or "--help" in sys.argv):
    from vitsinks.configs.usage import answer_help

    answer_help()
