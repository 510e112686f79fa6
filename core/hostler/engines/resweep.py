"""SV10a for ds4 (driver): after "exited before ready", sweep stale ds4 strays once, then retry.

ds4-server is a hard singleton (D4): while a ds4 engine that nobody owns any more is still
dying (IN4: just SIGKILLed, or left by a daemon that died), a new one exits before it is ready.
The recovery sweeps once and retries once, and only when the sweep stopped something.

What may be swept is narrower than the seed's "every owner-less process running the binary":
hostler signals only processes that carry a launch token of *this* data directory (SG4, the
design's non-negotiable), that no engine of this daemon owns (``owned``: the live pids of its
supervisors, IN2), that no other live daemon pays for (``held_by_other``, IN3), and whose
command line names the ds4 binary or the model (SV11's anchors). A ds4-server of another
program or another data directory is never touched: that start fails with the lock holder
named in its message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

import anyio
import psutil

from hostler.drivers.offloop import OffLoop
from hostler.engines.reconcile import Stray, find_strays, reap
from hostler.engines.supervisor import Supervisor
from hostler.errors import EngineStartError

__all__ = ["REAP_POLL", "REAP_WAIT", "anchors_of", "ensure_running_ds4", "sweep_ds4_strays"]

log = logging.getLogger(__name__)

#: SV11: how long reaped processes are waited for to vanish, and how often they are looked at.
REAP_WAIT = 10.0
REAP_POLL = 0.15


def anchors_of(argv: Iterable[str]) -> list[str]:
    """SV11: the absolute paths in a ds4 command line that identify its engines.

    The program when absolute, and absolute arguments that look like files (a dot-extension
    with a letter, at most 8 characters after the dot): the binary and the model.
    """
    found = []
    for index, arg in enumerate(argv):
        path = Path(arg)
        if not path.is_absolute():
            continue
        suffix = path.suffix[1:]
        if index == 0 or (0 < len(suffix) <= 8 and any(c.isalpha() for c in suffix)):
            found.append(arg)
    return found


def _anchored(command: str, anchors: Collection[str]) -> bool:
    return any(anchor in command for anchor in anchors)


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


async def sweep_ds4_strays(
    token_prefix: str,
    *,
    owned: Collection[int],
    anchors: Collection[str],
    held_by_other: Callable[[str], str | None] | None = None,
    wait: float = REAP_WAIT,
    poll: float = REAP_POLL,
    offloop: OffLoop | None = None,
) -> list[Stray]:
    """Stop this data directory's unowned ds4 strays; the ones stopped (see the module).

    Each is re-checked before every signal (SG4); then they are waited for up to ``wait``
    seconds to vanish (a zombie counts as gone: it holds no lock). Leftovers are logged.
    """
    io = offloop or OffLoop()
    strays = await io.run(lambda: find_strays(token_prefix, exclude=set(owned)))
    targets = [
        stray
        for stray in strays
        if _anchored(stray.command, anchors)
        and (held_by_other is None or held_by_other(stray.token) is None)
    ]
    for stray in targets:
        log.warning("hostler: stopping stray ds4 engine pid %d (%s)", stray.pid, stray.command)
        await reap(stray, io)
    deadline = anyio.current_time() + wait
    left = [stray.pid for stray in targets]
    while left:
        left = [pid for pid in left if not await io.run(_gone, pid)]
        if not left or anyio.current_time() >= deadline:
            break
        await anyio.sleep(poll)
    if left:
        log.warning("hostler: stray ds4 engines still present after %.0f s: %s", wait, left)
    return targets


async def ensure_running_ds4(
    supervisor: Supervisor,
    *,
    owned: Callable[[], Collection[int]],
    anchors: Collection[str],
    stale: Callable[[str], bool],
    should_retry: Callable[..., bool],
    held_by_other: Callable[[str], str | None] | None = None,
    cause: str = "request",
    wait: float = REAP_WAIT,
) -> int:
    """SV10a: :meth:`Supervisor.ensure_running`, with one sweep and one retry for ds4.

    When the start exits before ready (or ds4 says its lock is held) the strays are swept
    (:func:`sweep_ds4_strays`, ``anchors``: the launch's binary and model, :func:`anchors_of`
    its command line); ``owned`` gives the pids of every engine the daemon runs. When that
    stopped at least one, the start is tried once more (it counts against the restart budget
    like any start). Otherwise the first error is raised as it was.

    The engine's own rules decide: ``stale(message)`` whether a start failure may be a stale
    instance holding the lock, ``should_retry(message, attempt=, killed=)`` whether to try
    again (ds4: ``hostler_ds4.rules.exited_before_ready`` and ``should_retry_after_sweep``).
    """
    try:
        return await supervisor.ensure_running(cause)
    except EngineStartError as exc:
        if not stale(exc.message):
            raise
        first = exc
    swept = await sweep_ds4_strays(
        supervisor.token_prefix,
        owned=owned(),
        anchors=anchors,
        held_by_other=held_by_other,
        wait=wait,
    )
    if not should_retry(first.message, attempt=0, killed=len(swept)):
        raise first
    log.warning(
        "hostler: %s: retrying after stopping %d stray ds4 engine(s)", supervisor.key, len(swept)
    )
    return await supervisor.ensure_running("resweep-retry")
