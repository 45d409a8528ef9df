"""A trained variant as a hub-ready folder (docs/export.md): `model.safetensors`, `config.json` and a model card.
`timm_format` maps to timm's layouts, `provenance` reads what is exported, `facts` and `card` write the card,
`folder` writes and uploads the folder, `loader` reads it back. Its `__init__` imports nothing, so that
`vitsinks.pretrained.hub` can import the loader alone.
"""
