"""The pool's background work: one task group, each task in a cancel scope of its own.

Builds, engine watches and the pin keeper run here. Closing cancels each task's own scope, not
the task group's: cancelling that would cancel the caller's block too, entered in its task.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from anyio.abc import TaskGroup

from hostler.errors import RuntimeClosedError

__all__ = ["PoolTasks"]


class PoolTasks:
    """The pool's task group, whether it takes new work, and the scopes closing cancels."""

    def __init__(self) -> None:
        self._tg: TaskGroup | None = None
        self._scopes: set[anyio.CancelScope] = set()
        self._closed = False

    async def enter(self) -> None:
        """Open the task group (the pool's ``async with``)."""
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()

    async def exit(self, *exc_info: object) -> None:
        """Wait for the task group's tasks to end (after :meth:`cancel`), then leave it."""
        tg, self._tg = self._tg, None
        if tg is not None:
            await tg.__aexit__(*exc_info)  # type: ignore[arg-type]

    @property
    def closed(self) -> bool:
        """Whether the pool takes no new work (retiring, closing or closed)."""
        return self._closed

    @property
    def running(self) -> bool:
        """Whether the task group is entered and takes new work."""
        return self._tg is not None and not self._closed

    def refuse_new_work(self) -> None:
        """Take no new work from now; what runs goes on (PP9's retire)."""
        self._closed = True

    def cancel(self) -> None:
        """Take no new work and cancel every background task (PP8); not the caller's block."""
        self._closed = True
        for scope in list(self._scopes):
            scope.cancel()

    def check_open(self) -> None:
        """Raise unless the pool is entered and takes new work.

        Raises:
            RuntimeClosedError: It is closed, or was never entered.
        """
        if self._closed or self._tg is None:
            raise RuntimeClosedError(
                "the runtime is closed (or was never entered with `async with`); "
                "it starts no engine and takes no request"
            )

    def spawn(self, func: Callable[[], Coroutine[Any, Any, object]]) -> None:
        """Run ``func`` in the task group: it is cancelled when the pool closes.

        Raises:
            RuntimeClosedError: The pool is not entered, or closed.
        """
        if not self.running:
            raise RuntimeClosedError("the pool is not entered (use `async with`), or closed")
        self.start(func)

    def start(self, func: Callable[..., Coroutine[Any, Any, object]], *args: object) -> None:
        """Run ``func(*args)`` in the task group, in a cancel scope of its own (entered only)."""
        tg = self._tg
        assert tg is not None  # noqa: S101 - callers check

        async def scoped() -> None:
            with anyio.CancelScope() as scope:
                self._scopes.add(scope)
                if self._closed:
                    scope.cancel()
                try:
                    await func(*args)
                finally:
                    self._scopes.discard(scope)

        tg.start_soon(scoped)
