"""Sink diagnostics (docs/fidelity.md): per-head fields, NOP / broadcast classes, spectra, massive activations."""

from vitsinks.data.selection import fixed_images, images_of, selection_transform, stretched
from vitsinks.diagnostics.core import diagnose, diagnose_tokens, spectrum
from vitsinks.diagnostics.diagnosis import DIAGNOSIS, run_diagnostics
from vitsinks.diagnostics.fields import FIELDS, head_fields, qk_spectrum, stable_rank
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.diagnostics.summary import DiagnosticsSummary, classify, events, location, summarize

__all__ = ["DIAGNOSIS", "FIELDS", "DiagnosticsSummary", "SinkRules", "classify", "diagnose", "diagnose_tokens",
           "events", "fixed_images", "head_fields", "images_of", "location", "selection_transform", "qk_spectrum",
           "run_diagnostics", "spectrum", "stable_rank", "stretched", "summarize"]
