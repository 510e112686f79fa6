"""The engine process a supervisor holds, and what its output has said so far.

An :class:`EngineChild` is one run of an engine: its process (spawned or adopted, behind the
:class:`~hostler.engines.runner.EngineProcess` seam), the follower of its log file, and what the
adapter read in its lines — progress (PG1), the worst panic (its priority decides), whether the
ready line was seen (RD1) — with the last 200 lines kept for the error a failed start raises.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from hostler.engines.guard import AdapterGuard
from hostler.engines.logs import LogFollower
from hostler.engines.process import ProcessIdentity
from hostler.engines.runner import EngineProcess
from hostler.plugin import CacheAdapter, LaunchSpec, Panic, Progress

__all__ = ["EngineChild"]

#: How many of its last lines a run keeps for the message of a failed start.
KEPT_LINES = 200


@dataclass
class EngineChild:
    """One run of an engine, and what its output said.

    Attributes:
        proc: Its process, spawned or adopted from an earlier daemon.
        log: The follower of its log file.
        started: When it was spawned or adopted (wall time).
        spec: Its launch spec (None when adopted).
        panic: The worst panic its lines named so far.
        reached_ready: Whether it became ready.
        expected_stop: A stop of ours is under way (its exit is no crash).
        lines: Its last lines.
        ready_line: RD1: the line readiness waits for, if any.
        saw_ready_line: Whether that line was seen.
        progress: PG1: the last progress line of the current job.
        startup_timeout: RD7: what this start was given to become ready (seconds).
        cache: Its prompt-cache adapter, once made (L16: one per launch; None: it has none).
        cache_made: Whether ``cache`` was made (a plugin is asked once per launch).
    """

    proc: EngineProcess
    log: LogFollower
    started: float
    spec: LaunchSpec | None = None
    panic: Panic | None = None
    reached_ready: bool = False
    expected_stop: bool = False
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=KEPT_LINES))
    ready_line: re.Pattern[str] | None = None
    saw_ready_line: bool = False
    progress: Progress | None = None
    startup_timeout: float = 180.0
    cache: CacheAdapter | None = None
    cache_made: bool = False

    @property
    def identity(self) -> ProcessIdentity:
        """Who the process is."""
        return self.proc.identity

    @identity.setter
    def identity(self, identity: ProcessIdentity) -> None:
        self.proc.identity = identity

    def read_lines(self, guard: AdapterGuard, *, final: bool = False) -> None:
        """Read what it logged since the last look (all of it, to the end, when ``final``).

        Each line is kept, checked for the ready line, and handed to the adapter for progress
        and panics (a higher priority panic replaces a lower one). A hook that raises or
        answers wrong raises :class:`~hostler.errors.PluginError` (SG3).
        """
        adapter = guard.adapter
        lines = self.log.flush() if final else self.log.new_lines()
        for line in lines:
            self.lines.append(line)
            if self.ready_line is not None and self.ready_line.search(line):
                self.saw_ready_line = True
            step = guard.ask_maybe("progress", adapter.progress, line, returns=Progress)
            if step is not None:
                self.progress = step
            panic = guard.ask_maybe("classify_line", adapter.classify_line, line, returns=Panic)
            if panic is not None and (self.panic is None or panic.priority >= self.panic.priority):
                self.panic = panic

    def failure_reason(self, *, timed_out: bool) -> str:
        """Why its start failed, in one line: its panic, the timeout, or its exit and error."""
        if self.panic is not None:
            return self.panic.line
        if timed_out:
            return f"did not become ready within {self.startup_timeout:g} s"
        lines = [line.strip() for line in self.lines if line.strip()]
        errors = [line for line in lines if "error" in line.lower()]
        last = errors[0] if errors else (lines[-1] if lines else "")
        status = self.proc.exit_status()
        how = status.describe() if status is not None else "exit status unknown"
        return f"exited ({how}) before becoming ready" + (f": {last}" if last else "")
