"""A trained variant as a hub-ready folder (docs/export.md): `model.safetensors`, `config.json` and a model card.

- `timm_format`: which variants timm builds from a config alone, and the key mapping to its layouts and back;
- `source`: what is exported (a checkpoint, its run, its step) and what is refused (derived and imported runs);
- `facts`: what the card states, each read from the checkpoint and its run's files;
- `card`: the model card (the hub's metadata, then the facts);
- `folder`: the folder, staged and moved into place, and its upload to the hub (`huggingface_hub`);
- `loader`: an exported folder read back as vitsinks' own model (`vitsinks.pretrained.load("vitsinks:<folder>")`).

`python -m vitsinks.export` is the command. This package imports no command module, and its `__init__` imports
nothing, so that `vitsinks.pretrained.hub` can import the loader alone.
"""
