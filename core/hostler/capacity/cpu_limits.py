"""L22: what each engine build cannot run on this CPU, folded from ``cpu.unsupported`` (pure).

A start that dies of SIGILL before ready ran an instruction this CPU lacks. Launched with a
quantized KV cache, the cache is the suspect: every later launch of that build on this CPU
prices and runs f16 KV (S9's engine-supported types, narrowed). Launched with f16 KV already,
the model's weights are: that model cannot run on that build here, and a start of it is
refused at once, naming the fix (a portable build: ``hostler engine build llamacpp``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hostler.events.base import Event
from hostler.events.cpu import CPU_STREAM, CpuUnsupported

__all__ = [
    "CPU_STREAM",
    "FULL_PRECISION_KV",
    "CpuLimits",
    "CpuUnsupported",
    "build_fix",
    "weights_unrunnable",
]

#: The KV types that need no quantized kernels: what a build that cannot run a quantized
#: cache on this CPU is left with.
FULL_PRECISION_KV = ("f16", "f32", "bf16")


@dataclass
class CpuLimits:
    """What builds cannot run on which CPUs, as recorded.

    Attributes:
        quantized_kv: ``(build, cpu)`` pairs that died on a quantized KV cache.
        weights: ``(build, cpu, model)`` → the failure that showed the weights cannot run.
        version: The stream's version folded so far.
    """

    version: int = 0
    quantized_kv: set[tuple[str, str]] = field(default_factory=set)
    weights: dict[tuple[str, str, str], CpuUnsupported] = field(default_factory=dict)

    def apply(self, event: Event) -> None:
        """Fold one ``cpu.unsupported`` (other events are ignored)."""
        if not isinstance(event, CpuUnsupported):
            return
        if event.what == "quantized-kv":
            self.quantized_kv.add((event.build, event.cpu))
        elif event.what == "weights":
            self.weights[(event.build, event.cpu, event.model)] = event

    def kv_types(
        self, build: str, cpu: str, supported: tuple[str, ...] | None
    ) -> tuple[str, ...] | None:
        """The KV types a launch of ``build`` on ``cpu`` may use (None: any the planner likes).

        After a quantized cache died here, the full-precision ones among ``supported``.
        """
        if (build, cpu) not in self.quantized_kv:
            return supported
        kept = tuple(t for t in (supported or FULL_PRECISION_KV) if t in FULL_PRECISION_KV)
        return kept or supported

    def unrunnable(self, build: str, cpu: str, model: str) -> CpuUnsupported | None:
        """The recorded failure that showed ``model`` cannot run on ``build`` here, if any."""
        return self.weights.get((build, cpu, model))


def weights_unrunnable(key: str, message: str) -> str:
    """L22: the one line that says a model's weights cannot run on this engine build here."""
    return (
        f"{key}: this engine build cannot run the model's weights on this CPU: it died of "
        "SIGILL (an instruction this CPU lacks) even with an f16 KV cache "
        f"({message.removeprefix(key + ': ')[:200]}); {build_fix(key)}, or use a model of "
        "another type (F16, Q4_K)"
    )


def build_fix(key: str) -> str:
    """L22: how to get an engine build for this CPU, for ``key``'s engine."""
    engine = key.split(":", 1)[0] or "ENGINE"
    return f"build an engine for this CPU with `hostler engine build {engine}`"
