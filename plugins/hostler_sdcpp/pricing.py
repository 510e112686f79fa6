"""I6: what an ``sd-server`` holds at its peak, priced by resolution and batch (pure).

An image engine's memory is its weights (the diffusion model and every auxiliary file it is
launched with) plus the activations of one generation: the diffusion pass works on a whole
batch at once, the VAE then decodes one image at a time — in tiles when ``--vae-tiling`` is
on, so its working set stops growing past one tile. The per-pixel figures are estimates, not
measurements: hostler's learning (RD4) corrects them per model and build once engines have run.
No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from hostler.plugin import round_half_up

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_SIDE",
    "DIFFUSION_BYTES_PER_PIXEL",
    "MAX_BATCH",
    "MAX_SIDE",
    "MIN_SIDE",
    "RUNTIME_BYTES",
    "SIDE_MULTIPLE",
    "VAE_DECODE_BYTES_PER_PIXEL",
    "VAE_TILE_PIXELS",
    "WEIGHTS_FACTOR",
    "ImagePlan",
    "activation_bytes",
    "image_footprint",
    "plan_problem",
]

MIB = 1024**2
#: The width and height priced when the config names none (sd-server's default, 512).
DEFAULT_SIDE = 512
#: Images per request priced when the config names none.
DEFAULT_BATCH = 1
#: The smallest and largest side in pixels the planner accepts.
MIN_SIDE = 64
MAX_SIDE = 8192
#: Sides are whole latent cells: the VAE scales by 8.
SIDE_MULTIPLE = 8
#: The largest batch the planner accepts.
MAX_BATCH = 64
#: Weights are held with 10 % over their size on disk (as the default engine estimate).
WEIGHTS_FACTOR = 1.10
#: The process itself: backend, buffers, HTTP server.
RUNTIME_BYTES = 256 * MIB
#: The diffusion pass's working set per output pixel of each image in the batch.
DIFFUSION_BYTES_PER_PIXEL = 1536
#: The VAE decode's working set per output pixel of the one image being decoded.
VAE_DECODE_BYTES_PER_PIXEL = 4096
#: The pixels one VAE tile covers when tiling is on (a 256 x 256 tile).
VAE_TILE_PIXELS = 256 * 256


@dataclass(frozen=True, slots=True)
class ImagePlan:
    """The largest generation an engine is priced for.

    Attributes:
        width: Output width in pixels.
        height: Output height in pixels.
        batch: Images per request.
        vae_tiling: Whether the VAE decodes in tiles (``--vae-tiling``).
    """

    width: int = DEFAULT_SIDE
    height: int = DEFAULT_SIDE
    batch: int = DEFAULT_BATCH
    vae_tiling: bool = True


def plan_problem(plan: ImagePlan) -> str | None:
    """Why ``plan`` cannot be priced (one line), or None when it can."""
    for name, side in (("width", plan.width), ("height", plan.height)):
        if type(side) is not int or not MIN_SIDE <= side <= MAX_SIDE:
            return f"{name} {side!r}: from {MIN_SIDE} to {MAX_SIDE} pixels"
        if side % SIDE_MULTIPLE:
            return f"{name} {side}: a multiple of {SIDE_MULTIPLE} pixels"
    if type(plan.batch) is not int or not 1 <= plan.batch <= MAX_BATCH:
        return f"batch {plan.batch!r}: from 1 to {MAX_BATCH} images"
    return None


def activation_bytes(plan: ImagePlan) -> int:
    """The activations of the largest generation: the batch's diffusion pass plus one decode.

    Raises:
        ValueError: ``plan`` is out of range (:func:`plan_problem` says why).
    """
    problem = plan_problem(plan)
    if problem is not None:
        raise ValueError(problem)
    pixels = plan.width * plan.height
    decoded = min(pixels, VAE_TILE_PIXELS) if plan.vae_tiling else pixels
    return plan.batch * pixels * DIFFUSION_BYTES_PER_PIXEL + decoded * VAE_DECODE_BYTES_PER_PIXEL


def image_footprint(weights_bytes: int, plan: ImagePlan) -> int:
    """I6: the engine's peak: weights x 1.10 + 256 MiB + :func:`activation_bytes`.

    Raises:
        ValueError: A negative weight size, or ``plan`` out of range.
    """
    if weights_bytes < 0:
        raise ValueError(f"weights of {weights_bytes} bytes: a size is not negative")
    weights = round_half_up(weights_bytes * WEIGHTS_FACTOR)
    return weights + RUNTIME_BYTES + activation_bytes(plan)
