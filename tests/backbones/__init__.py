"""Tests of vitsinks.backbones: the adapter contract every model family meets."""
