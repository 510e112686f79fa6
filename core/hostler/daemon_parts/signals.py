"""SIGTERM and SIGINT as the daemon's shutdown, or no signals (an embedding program owns them)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager

import anyio

__all__ = ["first_signal", "signal_receiver"]


def signal_receiver(handle_signals: bool) -> AbstractContextManager[AsyncIterator[int]]:
    """SIGTERM and SIGINT as they come, or (``handle_signals=False``) a stream that never does."""
    if handle_signals:
        return anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT)
    return contextlib.nullcontext(_never())


async def first_signal(
    signals: AsyncIterator[int], scope: anyio.CancelScope, received: list[str]
) -> None:
    """At the first signal: its name goes in ``received`` and ``scope`` is cancelled."""
    async for signum in signals:
        received.append(signal.Signals(signum).name)
        scope.cancel()
        return


async def _never() -> AsyncIterator[int]:
    """A signal stream that never delivers (an embedding program owns the signals)."""
    await anyio.sleep_forever()
    yield 0  # pragma: no cover - never reached
