"""The one error hierarchy of hostler.

Every error hostler raises on purpose derives from :class:`HostlerError` and carries a stable
``code`` (for programs and logs) and a message a person can act on (for people). Codes never
change meaning once released; new failure modes get new codes.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "CapacityDeniedError",
    "ConcurrencyError",
    "DaemonRefusedError",
    "DaemonUnreachableError",
    "DeviceUnhealthyError",
    "EngineBinaryError",
    "EngineBusyError",
    "EngineStartError",
    "ExportFormatError",
    "ExtraMissingError",
    "HostlerError",
    "IllegalTransitionError",
    "ModelFileError",
    "OutputError",
    "PluginError",
    "QueueCancelledError",
    "QueueTimeoutError",
    "RequestBodyError",
    "RestartBudgetError",
    "RuntimeClosedError",
    "SettingError",
    "StartAbandonedError",
    "StoreBusyError",
    "StoreCorruptError",
    "StoreDamagedRowError",
    "StoreDriverError",
    "StoreError",
    "StoreForeignError",
    "StoreFullError",
    "StoreLockedError",
    "StoreNotEmptyError",
    "StorePathError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "StoreUrlError",
    "UnknownEngineError",
    "UsageError",
]


class HostlerError(Exception):
    """Root of every error hostler raises deliberately.

    Attributes:
        code: A stable, dotted identifier of the failure (``store.locked``).
        message: One line that names the thing and the cause.
    """

    code: ClassVar[str] = "hostler.error"
    exit_status: ClassVar[int] = 1
    """The CLI's exit status for this error."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(HostlerError):
    """A caller passed something hostler cannot use (bad option, bad filter, bad config).

    The CLI exits with status 2 for it, as for a mistyped option.
    """

    code = "usage.invalid"
    exit_status = 2


class RequestBodyError(UsageError):
    """An OpenAI request's body is malformed: answered 400 with the ``param`` at fault.

    Attributes:
        param: The body's field at fault (``messages[0].content``), None for the whole body.
    """

    code = "request.invalid"

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


class SettingError(UsageError):
    """An environment setting hostler reads is malformed or out of range (exit status 2)."""

    code = "usage.setting"


class StoreError(HostlerError):
    """The event log could not be opened, read or written."""

    code = "store.error"


class StorePathError(StoreError):
    """The event log's path is unusable: a directory, or in a directory we cannot write."""

    code = "store.path"


class StoreLockedError(StoreError):
    """Another daemon already owns this data directory (its lock file is held)."""

    code = "store.locked"


class StoreBusyError(StoreError):
    """Another writer held the database's write lock past hostler's wait; try again later."""

    code = "store.busy"


class StoreFullError(StoreError):
    """The disk (or the database's size limit) is full: nothing more can be written."""

    code = "store.full"


class StoreUnavailableError(StoreError):
    """The database server cannot be reached (down, restarting, the network cut); try again."""

    code = "store.unavailable"


class StoreCorruptError(StoreError):
    """The file exists but is not a readable hostler event log."""

    code = "store.corrupt"


class StoreDamagedRowError(StoreCorruptError):
    """Rows of the log could not be read (payload not JSON, a time that is not a time).

    Readers list and skip them, naming each row's ``seq``; the daemon treats them as a
    corrupt log and starts no new work.
    """

    code = "store.damaged-row"


class StoreSchemaError(StoreError):
    """The log was written by a newer hostler whose schema this version does not know."""

    code = "store.schema-too-new"


class StoreForeignError(StoreError):
    """The database holds another application's tables; hostler writes nothing into it."""

    code = "store.foreign"


class StoreUrlError(StoreError):
    """The database URL is malformed or names a database kind SQLAlchemy does not know."""

    code = "store.url"


class StoreDriverError(StoreError):
    """The database URL's driver package is not installed in hostler's environment."""

    code = "store.driver-missing"


class StoreNotEmptyError(StoreError):
    """An import was pointed at a log that already holds events; nothing was written."""

    code = "store.not-empty"


class ExportFormatError(HostlerError):
    """A file given to ``hostler import`` is not a whole, valid hostler export.

    The message names the line: a missing or foreign header, another format version, a line
    that is not JSON, misses a field, is longer than the limit, or a file cut short.
    """

    code = "export.format"


class ExtraMissingError(HostlerError):
    """A command needs an optional part of hostler that is not installed (an extra).

    The message names the command, the package and the install line (``pip install
    'hostler[plots]'``).
    """

    code = "install.extra-missing"


class OutputError(HostlerError):
    """A command could not write what it makes: its output, an export, a picture.

    The disk is full, over quota or read-only, or the device failed; whatever was being
    written is left as it was before (files are written whole or not at all).
    """

    code = "output.failed"


class ConcurrencyError(StoreError):
    """An append expected a stream version that is no longer the stream's last one.

    Nothing of the refused batch was written. Reload the stream and decide again.
    """

    code = "store.concurrency"

    def __init__(self, stream_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"stream {stream_id!r} is at version {actual}, not the expected {expected}: "
            "another writer got there first; reload the stream and retry"
        )
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual


class IllegalTransitionError(HostlerError):
    """A trigger was fired in a state that does not allow it; nothing was recorded."""

    code = "machine.illegal-transition"

    def __init__(
        self, machine: str, key: str, state: str, trigger: str, allowed: list[str]
    ) -> None:
        allowed_text = ", ".join(sorted(allowed)) or "none"
        super().__init__(
            f"{machine} {key!r} is {state}: trigger {trigger!r} is not allowed there "
            f"(allowed: {allowed_text})"
        )
        self.machine = machine
        self.key = key
        self.state = state
        self.trigger = trigger
        self.allowed = allowed


class ModelFileError(HostlerError):
    """A model file cannot be read: missing, not GGUF, truncated, or claiming absurd sizes."""

    code = "model.unreadable"


class UnknownEngineError(HostlerError):
    """No loaded plugin provides the engine a config or key names."""

    code = "plugin.unknown-engine"


class EngineBinaryError(HostlerError):
    """The engine's binary is missing or cannot be executed."""

    code = "engine.binary"


class EngineStartError(HostlerError):
    """An engine could not be started or did not become ready; the message says why."""

    code = "engine.start-failed"


class RestartBudgetError(HostlerError):
    """An engine crashed too often in a short time; it is locked out until a stated moment."""

    code = "engine.restart-budget"


class CapacityDeniedError(HostlerError):
    """The host's ledger refused the engine's footprint; nothing was started."""

    code = "capacity.denied"


class StartAbandonedError(HostlerError):
    """Everyone who asked for an engine left while room was being drained for it (PP18).

    The engine that was draining keeps serving; nothing was started.
    """

    code = "engine.abandoned"


class EngineBusyError(HostlerError):
    """An engine chosen to make room still served requests when its drain time ran out.

    It stays resident and keeps its reservation; nothing else was started in its place.
    """

    code = "engine.busy"


class DaemonUnreachableError(HostlerError):
    """A client command found no ``hostler serve`` answering at its address."""

    code = "daemon.unreachable"


class DaemonRefusedError(HostlerError):
    """The running ``hostler serve`` answered a client command with an error (its message kept).

    Attributes:
        status: The HTTP status it answered with (401: the token; 404: no such model...).
    """

    code = "daemon.refused"

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class RuntimeClosedError(HostlerError):
    """The runtime is closing or closed: it starts no engine and takes no new request."""

    code = "runtime.closed"


class PluginError(HostlerError):
    """An engine plugin raised where it should have answered; the message names the plugin.

    The engine it was serving is failed (recorded) and the daemon stays up.
    """

    code = "plugin.raised"


class DeviceUnhealthyError(HostlerError):
    """The device health gate held GPU work for its whole wait: a card stayed too hot (DH4).

    The message names the work, how long it waited, each reason, and how to change the mode.
    """

    code = "device.unhealthy"

    def __init__(self, context: str, waited: float, reasons: list[str], mode: str) -> None:
        because = "; ".join(reasons) or "no reason recorded"
        super().__init__(
            f"{context} blocked after {waited:.1f} s by the device health gate (mode {mode}): "
            f"{because}. Let the card cool, raise HOSTLER_DEVICE_SAFETY_MAX_WAIT_MS to wait "
            "longer, or set HOSTLER_DEVICE_SAFETY_MODE=observe (only the hard 105 °C limit holds "
            "work) or off"
        )
        self.context = context
        self.waited = waited
        self.reasons = reasons
        self.mode = mode


class QueueCancelledError(HostlerError):
    """A queued request was cancelled (by an operator or a program) before it got a slot.

    Nothing of it ran; the slot it would have used went to the next request.
    """

    code = "queue.cancelled"

    def __init__(self, engine: str, request_id: int, waited: float) -> None:
        super().__init__(
            f"request {request_id} was cancelled while queued for {engine!r} after waiting "
            f"{waited:.1f} s; nothing of it ran: send it again if it is still wanted"
        )
        self.engine = engine
        self.request_id = request_id
        self.waited = waited


class QueueTimeoutError(HostlerError):
    """A queued request did not get a slot within the caller's timeout; nothing of it ran.

    ``ahead`` is how many requests were ahead of it when it gave up (Q10).
    """

    code = "queue.timeout"

    def __init__(self, engine: str, request_id: int, waited: float, ahead: int) -> None:
        super().__init__(
            f"request {request_id} waited {waited:.1f} s in {engine!r}'s queue with {ahead} "
            f"ahead of it and did not start; nothing of it ran: retry later, or allow a "
            f"longer timeout"
        )
        self.engine = engine
        self.request_id = request_id
        self.waited = waited
        self.ahead = ahead
