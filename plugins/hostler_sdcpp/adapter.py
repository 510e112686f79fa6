"""The stable-diffusion.cpp adapter: how ``sd-server`` is launched, read and priced (§3.4)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hostler.plugin import (
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    ModelFileError,
    ModelGeometry,
    OptionType,
    Panic,
    Progress,
    ReadinessProbe,
    UsageError,
    check_model_path,
    extra_args_argv,
)
from hostler_sdcpp.binary import find_sd_server
from hostler_sdcpp.logs import classify_line, progress
from hostler_sdcpp.pricing import ImagePlan, image_footprint, plan_problem

__all__ = ["ROLE_FLAGS", "SDCPP_OPTIONS", "SdCppAdapter", "image_plan", "role_files"]

#: I2: the auxiliary files a model may need, by ``options`` key, and the flag that names each.
ROLE_FLAGS: Mapping[str, str] = {
    "vae": "--vae",
    "taesd": "--taesd",
    "clip_l": "--clip_l",
    "clip_g": "--clip_g",
    "clip_vision": "--clip_vision",
    "t5xxl": "--t5xxl",
    "llm": "--llm",
    "control_net": "--control-net",
}

#: Every ``options`` key the adapter reads, with its type.
SDCPP_OPTIONS: Mapping[str, OptionType] = {
    "diffusion_model": bool,  # the model is a standalone diffusion model (--diffusion-model)
    "steps": int,  # a distilled model's steps (4 or 8), passed as --steps
    "vae_tiling": bool,  # default True: --vae-tiling (False for a model known to show seams)
    "width": int,  # the largest generation priced (I6)
    "height": int,
    "batch": int,
    **dict.fromkeys(ROLE_FLAGS, str),
}


def role_files(options: Mapping[str, object]) -> list[tuple[str, Path]]:
    """I2: ``(flag, absolute path)`` of each auxiliary file in ``options``, in ROLE_FLAGS order."""
    return [
        (flag, Path(str(options[role])).expanduser().absolute())
        for role, flag in ROLE_FLAGS.items()
        if role in options
    ]


def _int(options: Mapping[str, object], key: str, default: int) -> int:
    value = options.get(key, default)
    return value if type(value) is int else default


def image_plan(options: Mapping[str, object]) -> ImagePlan:
    """I6: the generation the engine is priced for, from ``options`` (512 x 512, batch 1).

    Raises:
        UsageError: A width, height or batch out of range, in one line.
    """
    plan = ImagePlan(
        width=_int(options, "width", 512),
        height=_int(options, "height", 512),
        batch=_int(options, "batch", 1),
        vae_tiling=options.get("vae_tiling", True) is not False,
    )
    problem = plan_problem(plan)
    if problem is not None:
        raise UsageError(f"sdcpp options: {problem}")
    return plan


class SdCppAdapter(EngineAdapter):
    """``sd-server`` from stable-diffusion.cpp: one image model per process, on the ``image`` slot.

    Readiness is any HTTP answer at ``/`` (I1: the model is loaded before the port opens, and
    the server has no health endpoint); each request holds the GPU's ``image`` lease for its
    whole run (GA8, I4), so under ``swap`` a chat request waits instead of evicting it.
    """

    engine_type = "sdcpp"
    readiness_path = "/"
    gpu_slot = "image"
    #: The extras end the argv, after ``--listen-ip/--listen-port``.
    applies_extra_args = True
    options_schema = SDCPP_OPTIONS
    #: I1/RD7: 5 minutes to load the image model; idle-stopped after 30 minutes unused (a
    #: shorter idle stop killed long renders), not after the daemon's 5.
    startup_timeout = 300.0
    default_idle_timeout = 1800.0

    def __init__(self, binary: str | os.PathLike[str] | None = None) -> None:
        self._configured = binary

    def binary(self, spec: LaunchSpec | None = None) -> Path:
        """The binary to launch: the config's, the adapter's, ``$HOSTLER_SD_SERVER``, ``PATH``."""
        if spec is not None and spec.binary is not None:
            return find_sd_server(spec.binary)
        return find_sd_server(self._configured)

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        """I2: the weights flag, the auxiliary files, steps, tiling, the listener, the extras."""
        options = spec.options
        weights = "--diffusion-model" if options.get("diffusion_model") is True else "--model"
        argv = [str(self.binary(spec)), weights, str(spec.model)]
        for flag, path in role_files(options):
            argv += [flag, str(path)]
        steps = options.get("steps")
        if type(steps) is int:
            argv += ["--steps", str(steps)]
        if options.get("vae_tiling", True) is not False:
            argv.append("--vae-tiling")
        argv += ["--listen-ip", "127.0.0.1", "--listen-port", str(spec.port)]  # IN41
        return LaunchCommand([*argv, *extra_args_argv(spec.extra_args)])

    def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
        """I1: ``GET /``; any answer at all means the listener (and so the model) is up."""
        del spec
        return ReadinessProbe(path="/", wait=2.0)

    def is_ready_response(self, status: int, body: bytes) -> bool:
        """I1: any HTTP status (a 404 still proves the listener)."""
        del body
        return 100 <= status <= 599

    def read_geometry(self, model: Path) -> ModelGeometry:
        """The model file's size (image models carry no LLM geometry)."""
        path = check_model_path(model, "file")
        size = path.stat().st_size
        return ModelGeometry(architecture="stable-diffusion", file_size=size, tensor_bytes=size)

    def estimate_footprint(self, geometry: ModelGeometry, spec: LaunchSpec) -> int:
        """I6: the model and its auxiliary files, priced with the largest generation planned.

        Raises:
            ModelFileError: An auxiliary file is missing or not a file.
            UsageError: The planned width, height or batch is out of range.
        """
        weights = geometry.file_size
        for _flag, path in role_files(spec.options):
            try:
                weights += check_model_path(path, "file").stat().st_size
            except OSError as exc:
                raise ModelFileError(f"{path}: cannot be read ({exc.strerror})") from None
        return image_footprint(weights, image_plan(spec.options))

    def classify_line(self, line: str) -> Panic | None:
        """SV14 for sd-server: out of memory, a model it cannot load, a refused argv."""
        return classify_line(line)

    def progress(self, line: str) -> Progress | None:
        """I5/PG1: the diffusion step of the render under way, from sd-server's progress bar."""
        found = progress(line)
        return None if found is None else Progress(*found)
