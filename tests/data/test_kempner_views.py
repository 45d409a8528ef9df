"""`views.style=kempner`: the reference's view augmentations (src/data.py, held bit for bit against it in
tests/test_fidelity_rows.py) as a style of the CPU pipeline: its place among the settings, its local views, its
per-sample seeding, and the device backend's refusal of it."""

from __future__ import annotations

import pytest
import torch
from lightly.transforms.dino_transform import DINOViewTransform
from PIL import Image
from torchvision import transforms

from vitsinks.benchmarks.data import natural_image
from vitsinks.configs.schema import ViewsConfig, load_config
from vitsinks.data.crops import SeededViews, collate_views, view_transform
from vitsinks.data.device_crops import view_specs
from vitsinks.utils.errors import ConfigError


def test_the_default_style_is_dino_and_the_paper_recipe_sets_kempner_on_the_cpu() -> None:
    assert ViewsConfig().style == "dino" and load_config([]).views.style == "dino"
    assert all(isinstance(t, DINOViewTransform) for t in view_transform(ViewsConfig()).transforms)
    v = load_config(["recipe=paper"]).views
    assert (v.style, v.backend) == ("kempner", "cpu")
    assert load_config(["recipe=paper", "views.style=dino", "views.backend=device"]).views.backend == "device"


def test_kempner_with_the_device_backend_is_refused_in_one_line_naming_both_and_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(["recipe=paper", "views.backend=device"])
    msg = str(err.value)
    assert "\n" not in msg
    assert "views.style=kempner" in msg and "views.backend=device" in msg
    assert "set views.backend=cpu, or views.style=dino" in msg
    with pytest.raises(ConfigError, match="views.style=dino only"):
        view_specs(ViewsConfig(style="kempner"))  # type: ignore[arg-type]


def test_every_kempner_view_is_the_same_pipeline_locals_at_their_own_size_and_scale() -> None:
    v = ViewsConfig(style="kempner", n_global=2, global_size=48, global_scale=[0.2, 0.9], n_local=3,  # type: ignore[arg-type]
                    local_size=24, local_scale=[0.05, 0.3], color_jitter=0.7, grayscale=0.1, blur=0.4, solarize=0.3,
                    hflip=0.6)
    views = view_transform(v).transforms
    assert len(views) == 5
    for i, view in enumerate(views):
        assert isinstance(view, transforms.Compose)
        crop, jitter, gray, blur, solarize, flip, to_tensor, norm = view.transforms
        size, scale = ((48, 48), (0.2, 0.9)) if i < 2 else ((24, 24), (0.05, 0.3))
        assert (tuple(crop.size), tuple(crop.scale)) == (size, scale)
        assert crop.interpolation == transforms.InterpolationMode.BILINEAR
        cj = jitter.transforms[0]
        assert jitter.p == 0.7 and (cj.brightness, cj.contrast, cj.saturation, cj.hue) == (
            (1 - 0.8, 1.8), (1 - 0.8, 1.8), (1 - 0.8, 1.8), (-0.2, 0.2))  # ColorJitter(0.8, 0.8, 0.8, 0.2)
        assert gray.p == 0.1 and flip.p == 0.6 and isinstance(to_tensor, transforms.ToTensor)
        assert blur.p == 0.4 and blur.transforms[0].kernel_size == (7, 7) and blur.transforms[0].sigma == (0.1, 2.0)
        assert solarize.p == 0.3 and (solarize.transforms[0].threshold, solarize.transforms[0].p) == (128, 0.5)
        assert (tuple(norm.mean), tuple(norm.std)) == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    out = view_transform(v)(natural_image(0, 90, 70))
    assert [tuple(t.shape) for t in out] == [(3, 48, 48)] * 2 + [(3, 24, 24)] * 3


def test_kempner_views_are_a_pure_function_of_seed_epoch_and_index() -> None:
    """A resumed run sees the same views: the item is the same whatever was drawn before it, and the draws leave
    torch's generator as they found it."""
    v = load_config(["recipe=paper", "views.global_size=32"]).views
    base: list[tuple[Image.Image, int]] = [(natural_image(i, 64, 48), i) for i in range(3)]
    ds = SeededViews(base, view_transform(v), seed=5)
    first = collate_views([ds[i] for i in range(3)])[0]
    torch.rand(17)  # other draws in between (a training step's), then the items again, in another order
    again = collate_views([ds[i] for i in (2, 0, 1)])[0]
    assert all(torch.equal(a[[2, 0, 1]], b) for a, b in zip(first, again, strict=True))
    state = torch.get_rng_state()
    ds[0]
    assert torch.equal(torch.get_rng_state(), state)  # the views leave torch's generator as they found it
    ds.epoch = 1
    assert not torch.equal(torch.stack(ds[0][0]), torch.stack([f[0] for f in first]))
