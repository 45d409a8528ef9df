"""Main entry point: `python -m vitsinks.launch exp=gate+reg [model=... data=... train=...]`."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from vitsinks.config import config_dir, register_configs
from vitsinks.models import build_vit


def model_from_config(cfg: DictConfig):
    """Build the ViT described by `cfg.model`."""
    m = cfg.model
    return build_vit(
        m.size, img_size=m.img_size, patch_size=m.patch_size, embed_dim=m.embed_dim, depth=m.depth,
        num_heads=m.num_heads, mlp_ratio=m.mlp_ratio, qkv_bias=m.qkv_bias, layerscale_init=m.layerscale_init,
        drop_path=m.drop_path, gate=m.gate, registers=m.registers, attn=m.attn,
    )


def main(cfg: DictConfig) -> None:
    print(OmegaConf.to_yaml(cfg, resolve=True))
    model = model_from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    print(f"variant {model.variant}: {n / 1e6:.2f}M parameters, {model.tokens_per_image()} tokens per image")


register_configs()
hydra_main = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")(main)

if __name__ == "__main__":
    hydra_main()
