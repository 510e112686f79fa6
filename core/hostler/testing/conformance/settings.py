"""The settings of the adapter conformance suite a subclass may change, and its launch spec."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from hostler.plugin import LaunchSpec

__all__ = ["ConformanceSettings"]


class ConformanceSettings:
    """What :class:`~hostler.testing.conformance.AdapterConformance` checks with.

    Class attributes a subclass may set:
        serves_completions: The engine answers ``completion_path`` with an OpenAI completion.
        completion_path: Where the live check asks for one.
        completion_body: What it sends.
        stream_body: What the checks of a busy engine stream: a completion long enough to
            be still running while they ask the engine something else (400 tokens).
        startup_timeout: Seconds the live checks give the engine to become ready.
        stop_grace: Seconds between the stop's SIGTERM and SIGKILL.
        ctx_per_slot: The context the launch specs ask for.
        price_tolerance: How far the measured footprint of a launch may exceed the
            adapter's estimate, as a share of the estimate ...
        price_slack: ... or in bytes, whichever allows more (a quarter, 32 MiB).
    """

    serves_completions: ClassVar[bool] = True
    completion_path: ClassVar[str] = "/v1/chat/completions"
    completion_body: ClassVar[dict[str, Any]] = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 2,
        "temperature": 0,
    }
    stream_body: ClassVar[dict[str, Any]] = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    startup_timeout: ClassVar[float] = 120.0
    stop_grace: ClassVar[float] = 5.0
    ctx_per_slot: ClassVar[int] = 512
    price_tolerance: ClassVar[float] = 0.25
    price_slack: ClassVar[int] = 32 * 1024 * 1024

    def launch_spec(
        self, model: Path, port: int, options: dict[str, object], **changes: Any
    ) -> LaunchSpec:
        """The spec the suite launches (``changes`` replace its fields)."""
        spec = LaunchSpec(
            "conformance:m:0", model, port, ctx_per_slot=self.ctx_per_slot, options=options
        )
        return replace(spec, **changes)
