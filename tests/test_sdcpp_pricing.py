"""I6: the sd-cpp activation-peak pricing, constants pinned by value and edges by number."""

from __future__ import annotations

import pytest

from hostler_sdcpp import pricing
from hostler_sdcpp.pricing import ImagePlan, activation_bytes, image_footprint, plan_problem

MIB = 1024**2


def test_constants_are_pinned() -> None:
    assert pricing.DEFAULT_SIDE == 512
    assert pricing.DEFAULT_BATCH == 1
    assert (pricing.MIN_SIDE, pricing.MAX_SIDE, pricing.SIDE_MULTIPLE) == (64, 8192, 8)
    assert pricing.MAX_BATCH == 64
    assert pricing.WEIGHTS_FACTOR == 1.10
    assert pricing.RUNTIME_BYTES == 268_435_456
    assert pricing.DIFFUSION_BYTES_PER_PIXEL == 1536
    assert pricing.VAE_DECODE_BYTES_PER_PIXEL == 4096
    assert pricing.VAE_TILE_PIXELS == 65_536
    assert ImagePlan() == ImagePlan(512, 512, 1, vae_tiling=True)


def test_the_default_plan_by_value() -> None:
    # 512 x 512 = 262,144 px: diffusion 384 MiB; the tiled decode 65,536 px x 4096 = 256 MiB
    assert activation_bytes(ImagePlan()) == 384 * MIB + 256 * MIB
    # untiled, the whole image is decoded at once: 1 GiB
    assert activation_bytes(ImagePlan(vae_tiling=False)) == 384 * MIB + 1024 * MIB


def test_the_footprint_adds_weights_runtime_and_activations() -> None:
    assert image_footprint(0, ImagePlan()) == 256 * MIB + 640 * MIB
    assert image_footprint(1000, ImagePlan()) == 1100 + 256 * MIB + 640 * MIB
    # 1.10 of 5 bytes is 5.5: halves round up
    assert image_footprint(5, ImagePlan()) == 6 + 896 * MIB
    with pytest.raises(ValueError, match="not negative"):
        image_footprint(-1, ImagePlan())


def test_batch_scales_the_diffusion_pass_only() -> None:
    one = activation_bytes(ImagePlan(batch=1))
    four = activation_bytes(ImagePlan(batch=4))
    assert four - one == 3 * 512 * 512 * 1536  # the decode stays one image at a time


def test_the_tile_caps_the_decode_at_its_size() -> None:
    small = ImagePlan(width=128, height=128)  # 16,384 px: below one tile, decoded whole
    assert activation_bytes(small) == 16_384 * 1536 + 16_384 * 4096
    at_tile = ImagePlan(width=256, height=256)  # exactly one tile
    assert activation_bytes(at_tile) == 65_536 * (1536 + 4096)
    big = ImagePlan(width=1024, height=1024)  # past a tile: the decode stays one tile
    assert activation_bytes(big) == 1024 * 1024 * 1536 + 65_536 * 4096


def test_larger_images_never_cost_less() -> None:
    sizes = [64, 256, 512, 768, 1024, 2048]
    prices = [activation_bytes(ImagePlan(width=s, height=s)) for s in sizes]
    assert prices == sorted(prices) and len(set(prices)) == len(prices)


@pytest.mark.parametrize(
    ("plan", "problem"),
    [
        (ImagePlan(width=64), None),
        (ImagePlan(width=8192, height=8192), None),
        (ImagePlan(batch=1), None),
        (ImagePlan(batch=64), None),
        (ImagePlan(width=56), "width 56: from 64 to 8192 pixels"),
        (ImagePlan(height=8200), "height 8200: from 64 to 8192 pixels"),
        (ImagePlan(width=0), "width 0: from 64 to 8192 pixels"),
        (ImagePlan(width=-512), "width -512: from 64 to 8192 pixels"),
        (ImagePlan(width=100), "width 100: a multiple of 8 pixels"),
        (ImagePlan(batch=0), "batch 0: from 1 to 64 images"),
        (ImagePlan(batch=65), "batch 65: from 1 to 64 images"),
        (ImagePlan(batch=-1), "batch -1: from 1 to 64 images"),
        (ImagePlan(width=True), "width True: from 64 to 8192 pixels"),
        (ImagePlan(width=512.0), "width 512.0: from 64 to 8192 pixels"),  # type: ignore[arg-type]
    ],
)
def test_plan_edges(plan: ImagePlan, problem: str | None) -> None:
    assert plan_problem(plan) == problem
    if problem is None:
        assert activation_bytes(plan) > 0
    else:
        with pytest.raises(ValueError, match=problem.split(":")[0]):
            activation_bytes(plan)
