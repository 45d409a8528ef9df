"""Tests of vitsinks.pretrained. The optional libraries (the `hf` and `clip` extras) skip their tests when missing,
except under CI (CI=true), which installs them: there a missing one fails (`tests.helpers.requirements.require`)."""
