"""Fatal lines in llama-server's output (rule SV14, plus startup failures)."""

from __future__ import annotations

from hostler.plugin import FatalLines

__all__ = ["classify_line"]


# (kind, priority, pattern), first match wins; every one is fatal before readiness.
classify_line = FatalLines(
    [
        ("cuda-invalid-argument", 3, r"cuda error: invalid (configuration )?argument"),
        ("cuda-out-of-memory", 3, r"cuda.*(out of memory|memory allocation)|cudaMalloc failed"),
        (
            "vulkan-out-of-memory",
            3,
            r"ErrorOutOfDeviceMemory|VK_ERROR_OUT_OF_DEVICE_MEMORY|vulkan.*out of device memory"
            r"|ggml_vulkan.*(allocation|memory).*failed",
        ),
        ("cuda-illegal-memory-access", 3, r"illegal memory access"),
        ("cuda-device-assert", 3, r"device-side assert"),
        ("cuda-error", 1, r"CUDA error:"),
        ("assertion", 2, r"assert(ion)? failed|GGML_ASSERT"),
        # Startup failures llama-server reports before exiting with status 1.
        (
            "model-unreadable",
            3,
            r"failed to open GGUF file|gguf_init_from_\w+: .*(bad|invalid|failed)",
        ),
        ("model-load-failed", 3, r"error loading model|failed to load model"),
        ("bind-failed", 3, r"couldn't bind HTTP server socket"),
        ("bad-argument", 3, r"error: invalid argument|error while handling argument"),
    ]
)
