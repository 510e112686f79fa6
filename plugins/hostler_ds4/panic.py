"""Fatal lines in ds4-server's output: its startup refusals and GPU failures (SV14)."""

from __future__ import annotations

import re

from hostler.plugin import Panic

__all__ = ["classify_line"]

_CLIP = 1000


def _rule(kind: str, priority: int, pattern: str) -> tuple[str, int, re.Pattern[str]]:
    return kind, priority, re.compile(pattern, re.IGNORECASE)


# (kind, priority, pattern), first match wins; every one is fatal before readiness.
_RULES = [
    # D4, IN4: the hard singleton refused this start (another instance holds the lock)
    _rule("instance-locked", 3, r"another (ds4-server )?instance|single-instance lock"),
    _rule("cuda-out-of-memory", 3, r"cuda.*(out of memory|memory allocation)|cudaMalloc failed"),
    _rule(
        "metal-out-of-memory", 3, r"insufficient memory|metal.*(failed to allocate|out of memory)"
    ),
    _rule("cuda-illegal-memory-access", 3, r"illegal memory access"),
    _rule("cuda-error", 1, r"CUDA error"),
    _rule("model-load-failed", 3, r"failed to load model|error loading model"),
    _rule("shaders-missing", 3, r"cannot load shaders"),
    _rule("no-gpu-backend", 3, r"choose one GPU backend|never runs on CPU|--metal needs macOS"),
    _rule("bind-failed", 3, r"cannot listen on"),
    _rule("bad-argument", 3, r"ds4-server: error: (unrecognized arguments|argument )|--\S+ must"),
]


def classify_line(line: str) -> Panic | None:
    """The first rule a line matches, or None."""
    clipped = line[:_CLIP]
    for kind, priority, pattern in _RULES:
        if pattern.search(clipped):
            return Panic(kind, clipped.strip(), priority)
    return None
