"""Fatal lines in ds4-server's output: its startup refusals and GPU failures (SV14)."""

from __future__ import annotations

from hostler.plugin import FatalLines

__all__ = ["classify_line"]


# (kind, priority, pattern), first match wins; every one is fatal before readiness.
classify_line = FatalLines(
    [
        # D4, IN4: the hard singleton refused this start (another instance holds the lock)
        ("instance-locked", 3, r"another (ds4-server )?instance|single-instance lock"),
        ("cuda-out-of-memory", 3, r"cuda.*(out of memory|memory allocation)|cudaMalloc failed"),
        (
            "metal-out-of-memory",
            3,
            r"insufficient memory|metal.*(failed to allocate|out of memory)",
        ),
        ("cuda-illegal-memory-access", 3, r"illegal memory access"),
        ("cuda-error", 1, r"CUDA error"),
        ("model-load-failed", 3, r"failed to load model|error loading model"),
        ("shaders-missing", 3, r"cannot load shaders"),
        ("no-gpu-backend", 3, r"choose one GPU backend|never runs on CPU|--metal needs macOS"),
        ("bind-failed", 3, r"cannot listen on"),
        ("bad-argument", 3, r"ds4-server: error: (unrecognized arguments|argument )|--\S+ must"),
    ]
)
