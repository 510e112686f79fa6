"""Every subcommand's argument parser, in modules that import nothing heavy.

``hostler --help`` and each command's ``--help`` build parsers only: each module here imports
argparse, :mod:`hostler.cli.options` and little else. A command's body (its module in
:mod:`hostler.cli`, with the libraries it needs) is imported by :func:`later` when the command
runs, and an argument type that needs a library the same way, when its option is given.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Later", "later"]


class Later:
    """``module.name``, imported on the first call: a command's body or an argument type.

    Its ``__name__`` is ``name``: argparse names an argument type by it in a refusal.
    """

    def __init__(self, module: str, name: str = "run") -> None:
        self.module = module
        self.__name__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Import the module and call its function."""
        return getattr(importlib.import_module(self.module), self.__name__)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"later({self.module!r}, {self.__name__!r})"


def later(module: str, name: str = "run") -> Later:
    """``module.name``, imported when first called (see :class:`Later`)."""
    return Later(module, name)
