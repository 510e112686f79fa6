"""Fatal lines in llama-server's output (rule SV14, plus startup failures)."""

from __future__ import annotations

import re

from hostler.plugin import Panic

__all__ = ["classify_line"]

_CLIP = 1000


# (kind, priority, fatal before readiness, pattern), first match wins.
def _rule(kind: str, priority: int, pattern: str) -> tuple[str, int, re.Pattern[str]]:
    return kind, priority, re.compile(pattern, re.IGNORECASE)


# (kind, priority, pattern), first match wins; every one is fatal before readiness.
_RULES = [
    _rule("cuda-invalid-argument", 3, r"cuda error: invalid (configuration )?argument"),
    _rule("cuda-out-of-memory", 3, r"cuda.*(out of memory|memory allocation)|cudaMalloc failed"),
    _rule(
        "vulkan-out-of-memory",
        3,
        r"ErrorOutOfDeviceMemory|VK_ERROR_OUT_OF_DEVICE_MEMORY|vulkan.*out of device memory"
        r"|ggml_vulkan.*(allocation|memory).*failed",
    ),
    _rule("cuda-illegal-memory-access", 3, r"illegal memory access"),
    _rule("cuda-device-assert", 3, r"device-side assert"),
    _rule("cuda-error", 1, r"CUDA error:"),
    _rule("assertion", 2, r"assert(ion)? failed|GGML_ASSERT"),
    # Startup failures llama-server reports before exiting with status 1.
    _rule(
        "model-unreadable",
        3,
        r"failed to open GGUF file|gguf_init_from_\w+: .*(bad|invalid|failed)",
    ),
    _rule("model-load-failed", 3, r"error loading model|failed to load model"),
    _rule("bind-failed", 3, r"couldn't bind HTTP server socket"),
    _rule("bad-argument", 3, r"error: invalid argument|error while handling argument"),
]


def classify_line(line: str) -> Panic | None:
    """The first rule a line matches, or None."""
    clipped = line[:_CLIP]
    for kind, priority, pattern in _RULES:
        if pattern.search(clipped):
            return Panic(kind, clipped.strip(), priority)
    return None
