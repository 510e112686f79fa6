"""An engine's run directory: its log file, capped by rotation, and no planted links.

Each engine key has a directory of its own under the data directory's ``run/``: the engine's
output goes to ``engine.log`` there (appended, so a copy-then-truncate rotation leaves it
writing at the new end), and its work files beside it. hostler never cuts or writes files
through a symbolic link planted in its place: such a directory is refused.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hostler.drivers.offloop import OffLoop
from hostler.engines.logs import rotate_log
from hostler.errors import EngineStartError
from hostler.paths import private_dir

__all__ = ["RunDir"]

log = logging.getLogger(__name__)


class RunDir:
    """One engine key's run directory.

    Args:
        key: The engine key (for messages).
        path: The directory.
        max_bytes: ``engine.log`` is rotated past this size.
        keep: How many rotated copies are kept.
        offloop: Where the rotation's file work runs.
    """

    def __init__(
        self, key: str, path: Path, *, max_bytes: int, keep: int, offloop: OffLoop
    ) -> None:
        self.key = key
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self._io = offloop
        self._trouble: str | None = None

    @property
    def log_path(self) -> Path:
        """The engine's output file."""
        return self.path / "engine.log"

    def linked(self) -> Path | None:
        """The directory or its parent when either is a symbolic link, else None."""
        return next((d for d in (self.path.parent, self.path) if d.is_symlink()), None)

    def prepare(self, work_dir: Path | None) -> None:
        """Make the directory (and the launch's work directory) private, refusing a link.

        Raises:
            EngineStartError: It or its parent is a symbolic link.
        """
        linked = self.linked()
        if linked is not None:  # planted: rotation would cut files wherever it points
            raise EngineStartError(
                f"{self.key}: {linked} is a symbolic link; hostler keeps an engine's log and "
                "work files only in a directory of its own: remove the link"
            )
        private_dir(self.path)
        if work_dir is not None:
            private_dir(work_dir)

    async def rotate(self) -> bool:
        """Cap ``engine.log`` (copy-then-truncate, off the loop); whether it rotated.

        A log that cannot be rotated (a full disk, say) is left to grow, and that is said once
        per distinct error; it never stops the engine or the watch.
        """
        path, max_bytes, keep = self.log_path, self.max_bytes, self.keep
        if self.linked() is not None:
            return False  # never cut files wherever a planted link points
        try:
            rotated = await self._io.run(lambda: rotate_log(path, max_bytes=max_bytes, keep=keep))
        except OSError as exc:
            if str(exc) != self._trouble:
                self._trouble = str(exc)
                log.warning("hostler: %s: cannot rotate %s: %s", self.key, path, exc)
            return False
        self._trouble = None
        return rotated
