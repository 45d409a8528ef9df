"""Tests of vitsinks.probes."""
