"""Facts in ``llama-server``'s own log: buffer sizes (at ``-lv 4``) and the build."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hostler.plugin import round_half_up

__all__ = ["BufferSizes", "classify_phase", "parse_buffer_sizes", "parse_build"]

MIB = 1024**2
_BUFFER = re.compile(
    r"(?P<device>[A-Za-z0-9_]+)\s+(?P<kind>model|KV|compute|output|RS)\s+buffer size\s*=\s*"
    r"(?P<mib>[\d.]+)\s*MiB"
)
_BUILD = re.compile(
    r"\bbuild:?\s*(\d+)\s*\((\w+)\)"  # "build 1 (7e4c0a9)" in the log
    r"|\"build_info\":\s*\"([^\"]+)\""  # /props
    r"|\bb(\d+)-([0-9a-f]{7,})"
)


@dataclass(frozen=True, slots=True)
class BufferSizes:
    """Bytes the engine says it allocated, by kind (one start's worth)."""

    model: int = 0
    kv: int = 0
    compute: int = 0
    output: int = 0
    recurrent: int = 0

    @property
    def total(self) -> int:
        """Everything the engine listed."""
        return self.model + self.kv + self.compute + self.output + self.recurrent


def parse_buffer_sizes(text: str) -> BufferSizes:
    """Sum the ``... buffer size = N MiB`` lines of one start (the first of each device/kind).

    llama-server prints the same lines again when it exits; only the first occurrence of each
    (device, kind) pair counts.
    """
    seen: set[tuple[str, str]] = set()
    sums = {"model": 0.0, "KV": 0.0, "compute": 0.0, "output": 0.0, "RS": 0.0}
    for match in _BUFFER.finditer(text):
        pair = (match["device"], match["kind"])
        if pair in seen:
            continue
        seen.add(pair)
        sums[match["kind"]] += float(match["mib"])
    return BufferSizes(
        model=round_half_up(sums["model"] * MIB),
        kv=round_half_up(sums["KV"] * MIB),
        compute=round_half_up(sums["compute"] * MIB),
        output=round_half_up(sums["output"] * MIB),
        recurrent=round_half_up(sums["RS"] * MIB),
    )


def parse_build(text: str) -> str | None:
    """The build identity (``b1-7e4c0a9``) from a log or ``/props`` text, if present."""
    match = _BUILD.search(text)
    if match is None:
        return None
    if match.group(1):
        return f"b{match.group(1)}-{match.group(2)}"
    if match.group(3):
        return match.group(3)
    return f"b{match.group(4)}-{match.group(5)}"


_PHASES = (
    ("ready", re.compile(r"server is listening|listening on http", re.I)),
    ("loading_model", re.compile(r"load_model: loading model|llama_model_load|load_tensors", re.I)),
    ("prefill", re.compile(r"prompt processing|processing task|prompt eval", re.I)),
    ("generating", re.compile(r"n_decoded|generation|eval time", re.I)),
    ("starting", re.compile(r"build[: ]|system info|main: ", re.I)),
)


def classify_phase(line: str) -> str | None:
    """L20: the phase a log line announces, or None.

    One of ``starting``, ``loading_model``, ``prefill``, ``generating``, ``ready``.
    """
    for phase, pattern in _PHASES:
        if pattern.search(line):
            return phase
    return None
