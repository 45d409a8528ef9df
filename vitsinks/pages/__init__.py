"""The generated documentation pages: the options page and the variant lists (`python -m vitsinks.docs`)."""
