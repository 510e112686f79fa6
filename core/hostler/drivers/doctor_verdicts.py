"""``hostler doctor``'s verdicts (pure): each check's observation → one line, OK or the fix.

The driver (:mod:`hostler.drivers.doctor`) looks at the machine — binaries, the CPU, the data
directory, the token, the port, the models — and hands what it saw to one function here, which
says whether that is fine and, when it is not, the fix that works. Nothing here reads a file,
the environment, a socket or a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "BUILD_FIX",
    "BinarySeen",
    "CpuSeen",
    "DirSeen",
    "Finding",
    "PortSeen",
    "Status",
    "TokenSeen",
    "binary_verdict",
    "cpu_verdict",
    "data_dir_verdict",
    "gpu_verdict",
    "models_verdict",
    "port_verdict",
    "token_verdict",
]

#: ``ok``: fine; ``fail``: broken, the line names the fix; ``absent``: an optional part that
#: is not there (an engine this machine does not use, no NVIDIA card): not a failure.
Status = Literal["ok", "fail", "absent"]

#: L22's fix for an engine build that cannot run on this CPU.
BUILD_FIX = (
    "run `hostler engine build llamacpp` (builds llama-server for this CPU; needs cmake, g++)"
)
#: The most model ids one line names before counting the rest.
_NAMED_MODELS = 6


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the doctor's report.

    Attributes:
        check: What was checked (``llama-server``, ``data dir``, ``port``...).
        status: See :data:`Status`.
        detail: What was found, in one line.
        fix: What to do (None unless ``status`` is ``fail``).
    """

    check: str
    status: Status
    detail: str
    fix: str | None = None


@dataclass(frozen=True, slots=True)
class BinarySeen:
    """An engine program, as the driver found it.

    Attributes:
        program: Its name (``llama-server``).
        path: Where it was found (None: nowhere, or the one named is unusable).
        problem: Why it was not found or cannot be used (the search's own line).
        named: The path was named (a config ``binary`` or a ``HOSTLER_*`` variable): a
            problem is then the operator's to fix, even for an optional engine.
        version: What ``PROGRAM --version`` said (None: not asked, or it said nothing).
        run_failure: Why ``PROGRAM --version`` did not run (exit status, signal, timeout).
    """

    program: str
    path: Path | None = None
    problem: str | None = None
    named: bool = False
    version: str | None = None
    run_failure: str | None = None


def binary_verdict(seen: BinarySeen, *, required: bool, fix: str) -> Finding:
    """An engine program: found (and its version), or missing, unusable or not running here.

    A missing optional engine (``required`` False, nothing named) is ``absent``, not a
    failure; ``fix`` is how to get it when it is needed.
    """
    name = seen.program
    if seen.path is None:
        problem = seen.problem or f"{name} not found"
        if not required and not seen.named:
            return Finding(name, "absent", f"not found (optional; {fix})")
        return Finding(name, "fail", problem, fix if not seen.named else _named_fix(name))
    if seen.run_failure is not None:
        return Finding(
            name, "fail", f"{seen.path}: does not run here ({seen.run_failure})", BUILD_FIX
        )
    version = f" ({seen.version})" if seen.version else ""
    return Finding(name, "ok", f"{seen.path}{version}")


def _named_fix(program: str) -> str:
    return (
        f"point the variable (or the config's `binary`) at an executable {program}, "
        "or unset it to use the one found on PATH"
    )


@dataclass(frozen=True, slots=True)
class CpuSeen:
    """The CPU and what the data directory's log learned about the engine build here (L22).

    Attributes:
        name: The CPU's model name.
        identity: :func:`hostler.probes.cpu.cpu_identity`.
        features: The feature flags that matter to llama.cpp's CPU kernels, present or not.
        build: The llama.cpp build in use (its ``build_identity``; None: no binary found).
        quantized_kv: The log says this build died here on a quantized KV cache.
        weights: Models whose own weights this build cannot run here (per the log).
        log_problem: Why the log could not be read (None: read, or there is none yet).
    """

    name: str
    identity: str
    features: tuple[tuple[str, bool], ...]
    build: str | None = None
    quantized_kv: bool = False
    weights: tuple[str, ...] = ()
    log_problem: str | None = None


def cpu_verdict(seen: CpuSeen) -> Finding:
    """L22: what this CPU can run with the llama.cpp build in use, as the log learned it."""
    has = [flag for flag, present in seen.features if present]
    lacks = [flag for flag, present in seen.features if not present]
    parts = [f"{seen.name} ({seen.identity})"]
    if has:
        parts.append(f"has {' '.join(has)}")
    if lacks:
        parts.append(f"lacks {' '.join(lacks)}")
    about = "; ".join(parts)
    if seen.log_problem is not None:
        return Finding(
            "cpu",
            "fail",
            f"{about}; the log cannot be read: {seen.log_problem}",
            "see docs/errors.md for the code above",
        )
    learned: list[str] = []
    if seen.quantized_kv:
        learned.append("a quantized KV cache (it runs f16 KV instead)")
    if seen.weights:
        learned.append(f"the weights of {_named(seen.weights)}")
    if learned:
        return Finding(
            "cpu",
            "fail",
            f"{about}; the log says this llama-server cannot run {' nor '.join(learned)} "
            "on this CPU (L22: it died of SIGILL)",
            BUILD_FIX,
        )
    return Finding("cpu", "ok", f"{about}; nothing this llama-server cannot run here learned")


@dataclass(frozen=True, slots=True)
class DirSeen:
    """The data directory, as ``stat`` and ``access`` see it.

    Attributes:
        path: The directory.
        exists: Something is there (a directory or not).
        is_dir: It is a directory.
        mode: Its permission bits (``st_mode``; 0 when it does not exist).
        owner: Its owner's uid (-1 when it does not exist).
        me: This process's effective uid.
        writable: This user can create files in it (``W_OK | X_OK``).
        ancestor: When it does not exist: the nearest folder above it that does.
        ancestor_is_dir: That ancestor is a directory.
        ancestor_writable: That ancestor can be written (so the directory can be made).
    """

    path: Path
    exists: bool
    is_dir: bool = False
    mode: int = 0
    owner: int = -1
    me: int = -1
    writable: bool = False
    ancestor: Path | None = None
    ancestor_is_dir: bool = False
    ancestor_writable: bool = False


def data_dir_verdict(seen: DirSeen) -> Finding:
    """The data directory: usable, private (0700) or made so at the next start, or why not."""
    where = seen.path
    problem = _dir_problem(seen)
    if problem is not None:
        detail, fix = problem
        return Finding(
            "data dir",
            "fail",
            f"{where}: {detail}",
            f"{fix}, or use another data directory (--data-dir, HOSTLER_HOME)",
        )
    if not seen.exists:
        return Finding("data dir", "ok", f"{where}: not yet there; made (0700) at first run")
    mode = _permissions(seen.mode)
    tighten = ": made 0700 at the next start" if mode & 0o077 else ""
    return Finding("data dir", "ok", f"{where} (mode {mode:04o}{tighten})")


def _dir_problem(seen: DirSeen) -> tuple[str, str] | None:
    """What keeps the data directory from being used, and the fix (None: nothing)."""
    if not seen.exists:
        if seen.ancestor is not None and seen.ancestor_is_dir and seen.ancestor_writable:
            return None
        above = seen.ancestor or seen.path.parent
        why = "is not a directory" if not seen.ancestor_is_dir else "cannot be written"
        return f"cannot be created ({above} {why})", f"make {above} a directory you can write"
    if not seen.is_dir:
        return "exists and is not a directory", "move that file away"
    if seen.owner != seen.me:
        return f"owned by uid {seen.owner}, not by this user (uid {seen.me})", "chown it to you"
    if not seen.writable:
        mode = _permissions(seen.mode)
        return f"cannot be written (mode {mode:04o})", f"chmod 700 {seen.path}"
    return None


@dataclass(frozen=True, slots=True)
class TokenSeen:
    """Where ``hostler serve``'s bearer token comes from, and the file's state.

    Attributes:
        path: ``DATA_DIR/token``.
        auth_none: ``auth = none``: no token at all (loopback only).
        from_env: ``HOSTLER_TOKEN`` gives it.
        exists: The file is there (a regular file).
        mode: The file's permission bits (0 when absent).
        valid: Its text is a token (32 to 256 printable ASCII characters).
        unreadable: Why it cannot be read (None: read, or absent).
    """

    path: Path
    auth_none: bool = False
    from_env: bool = False
    exists: bool = False
    mode: int = 0
    valid: bool = False
    unreadable: str | None = None


def token_verdict(seen: TokenSeen) -> Finding:
    """The token clients (``hostler load``, the dashboard) read: there, private, well-formed."""
    if seen.auth_none:
        return Finding("token", "ok", "auth = none: every route open to this machine's users")
    if seen.from_env:
        return Finding("token", "ok", "HOSTLER_TOKEN gives it")
    if not seen.exists:  # a fresh data directory: nothing to fix, serve makes it
        return Finding(
            "token",
            "absent",
            f"{seen.path}: not made yet (the first `hostler serve` makes it, mode 0600)",
        )
    problem = _token_problem(seen)
    if problem is not None:
        detail, fix = problem
        return Finding("token", "fail", f"{seen.path}: {detail}", fix)
    return Finding("token", "ok", f"{seen.path} (mode {_permissions(seen.mode):04o})")


def _token_problem(seen: TokenSeen) -> tuple[str, str] | None:
    """What is wrong with the token file, and the fix (None: nothing)."""
    remake = f"delete {seen.path}; `hostler serve` makes a new one (mode 0600)"
    if seen.unreadable is not None:
        return f"cannot be read ({seen.unreadable})", f"chmod 600 {seen.path}"
    if not seen.valid:
        return "not a hostler token", remake
    mode = _permissions(seen.mode)
    if mode & 0o077:
        return f"readable by others (mode {mode:04o}): no secret any more", remake
    return None


@dataclass(frozen=True, slots=True)
class PortSeen:
    """The address ``hostler serve`` would listen on.

    Attributes:
        host: The address.
        port: The port.
        bind_problem: Why it could not be bound (None: it could: free).
        health: What ``GET /health`` answered there (None: nothing that speaks hostler's
            health answer): ``ok`` or ``closing``.
    """

    host: str
    port: int
    bind_problem: str | None = None
    health: str | None = None


def port_verdict(seen: PortSeen) -> Finding:
    """Free for ``hostler serve``, or held by a ``hostler serve``, or taken by something else."""
    where = f"{seen.host}:{seen.port}"
    if seen.bind_problem is None:
        return Finding("port", "ok", f"{where} is free for `hostler serve`")
    if seen.health is not None:
        return Finding(
            "port", "ok", f"{where}: a hostler serve is there (GET /health: {seen.health})"
        )
    return Finding(
        "port",
        "fail",
        f"{where}: {seen.bind_problem}, and it is not a hostler serve",
        "stop what listens there, or choose another port (HOSTLER_PORT, [server] port, "
        "hostler serve --port)",
    )


def gpu_verdict(cards: Sequence[tuple[str, int, int]], unavailable: str) -> Finding:
    """NVIDIA cards through NVML, each (name, total bytes, used bytes); none is not a failure."""
    if not cards:
        return Finding("gpu", "absent", f"no NVIDIA card ({unavailable or 'NVML lists none'})")
    shown = ", ".join(
        f"{name} ({_gib(total)} GiB, {_gib(used)} GiB used)" for name, total, used in cards
    )
    return Finding("gpu", "ok", shown)


def _gib(count: int) -> str:
    return f"{count / 2**30:.1f}"


def models_verdict(
    models: Sequence[tuple[str, Path]],
    missing: Sequence[Path],
    where: Path,
    *,
    configured: bool,
    refused: Sequence[tuple[str, str]] = (),
) -> Finding:
    """The models ``hostler serve`` would offer (id, file), and files that are not there.

    ``refused``: files discovery found and does not offer, with the reason (path, reason).
    """
    if missing:
        return Finding(
            "models",
            "fail",
            f"{len(missing)} configured model files missing: {_named(tuple(map(str, missing)))}",
            "fix each engine's `model` in the config (or restore the files)",
        )
    if not models:
        if configured:
            return Finding(
                "models",
                "fail",
                "the config names none",
                "add a [[models]] table to the config (docs/daemon.md)",
            )
        if refused:
            shown = "; ".join(f"{path}: {reason}" for path, reason in refused[:_NAMED_MODELS])
            more = len(refused) - _NAMED_MODELS
            return Finding(
                "models",
                "fail",
                f"no models in {where}: {len(refused)} found but not offered ({shown}"
                f"{f'; and {more} more' if more > 0 else ''})",
                f"put a .gguf model into {where} (or set HOSTLER_MODELS_DIR, or give --config "
                "FILE)",
            )
        return Finding(
            "models",
            "fail",
            f"no model files in {where}",
            f"put a .gguf model into {where} (or set HOSTLER_MODELS_DIR, or give --config FILE)",
        )
    folders = sorted({str(path.parent) for _, path in models})
    ids = _named(tuple(model for model, _ in models))
    return Finding("models", "ok", f"{len(models)} in {', '.join(folders)}: {ids}")


def _named(names: tuple[str, ...]) -> str:
    """Up to :data:`_NAMED_MODELS` names, then how many more."""
    shown = ", ".join(names[:_NAMED_MODELS])
    more = len(names) - _NAMED_MODELS
    return f"{shown} and {more} more" if more > 0 else shown


def _permissions(mode: int) -> int:
    """The permission bits of a file mode (``stat.S_IMODE``, kept here: no I/O module)."""
    return mode & 0o7777
