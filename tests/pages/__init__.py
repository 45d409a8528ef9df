"""Tests of vitsinks.pages."""
