"""The config of `python -m vitsinks.export` (`export.*`): a trained variant written as a hub-ready folder and, with
`push`, uploaded to the Hugging Face hub (docs/export.md); part of the run config's schema (`vitsinks.configs.schema`,
which re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExportConfig:
    """Where the folder goes and whether it is published (`vitsinks.publish`, docs/export.md)."""

    out: str | None = None  # the folder to write: new or empty, or an earlier export of the same checkpoint
    push: bool = False  # upload the folder to the Hugging Face hub (export.repo; the endpoint: HF_ENDPOINT)
    repo: str | None = None  # the hub repository, <user or organisation>/<name> (created if it does not exist)
    private: bool = False  # create the hub repository private (an existing one keeps its visibility)
    license: str | None = None  # the card's license (None: the package's own, else `other`)
