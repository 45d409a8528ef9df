"""The generated documentation pages: every command's options (docs/commands-options.md) and the variant lists
(`python -m vitsinks.docs`)."""
