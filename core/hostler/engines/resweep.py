"""SV10a (driver): after a start that exited before ready, sweep stale strays of the engine.

ds4-server is a hard singleton (D4): while a ds4 engine that nobody owns any more is still
dying (IN4: just SIGKILLed, or left by a daemon that died), a new one exits before it is ready.
The supervisor asks the adapter (``EngineAdapter.on_exited_before_ready``, RD9) whether such a
failure may be a stale instance; when it says so, the supervisor sweeps once with
:func:`sweep_strays` and retries once, and only when the sweep stopped something.

What may be swept is narrower than the seed's "every owner-less process running the binary":
hostler signals only processes that carry a launch token of *this* data directory (SG4, the
design's non-negotiable), that no engine of this daemon owns (``owned``: the live pids of its
supervisors, IN2), that no other live daemon pays for (``held_by_other``, IN3), and whose
command line names the failed launch's binary or model (SV11's anchors). An engine of another
program or another data directory is never touched: that start fails as it was (ds4 names the
lock holder in its message).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

import psutil

from hostler.clock import SYSTEM_CLOCK, Clock
from hostler.drivers.offloop import OffLoop
from hostler.engines.reconcile import Stray, find_strays, reap

__all__ = ["REAP_POLL", "REAP_WAIT", "anchors_of", "sweep_strays"]

log = logging.getLogger(__name__)

#: SV11: how long reaped processes are waited for to vanish, and how often they are looked at.
REAP_WAIT = 10.0
REAP_POLL = 0.15


def anchors_of(argv: Iterable[str]) -> list[str]:
    """SV11: the absolute paths in an engine's command line that identify its engines.

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


async def sweep_strays(
    token_prefix: str,
    *,
    owned: Collection[int],
    anchors: Collection[str],
    held_by_other: Callable[[str], str | None] | None = None,
    wait: float = REAP_WAIT,
    poll: float = REAP_POLL,
    offloop: OffLoop | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> list[Stray]:
    """Stop this data directory's unowned strays named by ``anchors``; the ones stopped.

    See the module for what may be swept.

    Each is re-checked before every signal (SG4); then they are waited for up to ``wait``
    seconds to vanish (a zombie counts as gone: it holds no lock). Leftovers are logged.
    """
    io = offloop or OffLoop()
    strays = await io.run(lambda: find_strays(token_prefix, exclude=set(owned)))
    targets = []
    for stray in strays:
        if not _anchored(stray.command, anchors):
            continue
        if held_by_other is not None and await io.run(held_by_other, stray.token) is not None:
            continue  # IN3: another live daemon pays for it
        targets.append(stray)
    for stray in targets:
        log.warning("hostler: stopping stray engine pid %d (%s)", stray.pid, stray.command)
        await reap(stray, io)
    deadline = clock.monotonic() + wait
    left = [stray.pid for stray in targets]
    while left:
        left = [pid for pid in left if not await io.run(_gone, pid)]
        if not left or clock.monotonic() >= deadline:
            break
        await clock.sleep(poll)
    if left:
        log.warning("hostler: stray engines still present after %.0f s: %s", wait, left)
    return targets
