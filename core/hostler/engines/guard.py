"""Asking an engine's adapter (plugin code) so that its faults are the plugin's, never ours.

Every hook a supervisor calls goes through :class:`AdapterGuard`: a raise that is not a
:class:`~hostler.errors.HostlerError` (a ``KeyError``, ``sys.exit()``) becomes a
:class:`~hostler.errors.PluginError` naming the plugin and the hook (SG3), and an answer of the
wrong type (a str for a verdict, an accidental coroutine) is the plugin's error too, never taken
at its truthiness (:func:`hostler.pluginhost.ask_adapter`, as pricing asks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from hostler.errors import HostlerError, PluginError
from hostler.plugin import EngineAdapter
from hostler.pluginhost import ask_adapter, describe_exception, plugin_fault

__all__ = ["AdapterGuard"]

T = TypeVar("T")


class AdapterGuard:
    """One engine key's adapter, asked safely.

    Args:
        key: The engine key (every message starts with it).
        adapter: The engine kind's adapter.
    """

    def __init__(self, key: str, adapter: EngineAdapter) -> None:
        self.key = key
        self.adapter = adapter

    def call(self, what: str, func: Callable[..., T], *args: object) -> T:
        """``func(*args)``; a raise that is not a HostlerError is the plugin's bug (SG3)."""
        try:
            return func(*args)
        except HostlerError:
            raise
        except BaseException as exc:  # sys.exit(), KeyboardInterrupt... from plugin code: its bug
            raise self.fault(f"raised {describe_exception(exc)} in {what}") from exc

    def ask(self, what: str, func: Callable[..., object], *args: object, returns: type[T]) -> T:
        """:meth:`call`, and its answer checked to be a ``returns`` (SG3)."""
        answer: T = ask_adapter(
            self.adapter, what, func, *args, returns=returns, prefix=f"{self.key}: "
        )
        return answer

    def ask_maybe(
        self, what: str, func: Callable[..., object], *args: object, returns: type[T]
    ) -> T | None:
        """:meth:`ask` for a hook whose answer may also be None (``progress``, a panic)."""
        answer: T | None = ask_adapter(
            self.adapter, what, func, *args, returns=returns, optional=True,
            prefix=f"{self.key}: ",
        )  # fmt: skip
        return answer

    def fault(self, what: str) -> PluginError:
        """The plugin's error for ``what`` it did, naming it."""
        found = plugin_fault(self.adapter.engine_type, type(self.adapter), what)
        return PluginError(f"{self.key}: {found.message}")
