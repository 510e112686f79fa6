"""The revision list hostler reads at every open matches what alembic ships in ``versions/``."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from hostler import EventStore
from hostler.errors import StoreForeignError
from hostler.store.migrate import current_revision, head_revision, shipped_revisions
from hostler_migrations import REVISIONS, SCRIPT_LOCATION

from _support import Note


def test_revisions_are_alembics_oldest_first() -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    scripts = ScriptDirectory.from_config(cfg)
    walked = [s.revision for s in scripts.walk_revisions()]  # newest first
    assert tuple(reversed(walked)) == REVISIONS
    assert head_revision() == scripts.get_current_head() == REVISIONS[-1] == "0002"
    assert shipped_revisions() == frozenset(walked)


def test_opening_a_log_at_head_does_not_import_alembic(tmp_path: Path) -> None:
    with EventStore.open(tmp_path / "events.db"):
        pass  # made at head (this process may import alembic)
    probe = (
        "import sys; from hostler import EventStore; "
        f"EventStore.open({str(tmp_path / 'events.db')!r}).close(); "
        "print('alembic' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_two_revisions_in_the_version_table_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with EventStore.open(path):
        pass
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO alembic_version VALUES ('0001b')")
    with pytest.raises(StoreForeignError, match="more than one schema revision"):
        EventStore.open(path).close()


def test_a_log_of_revision_0001_is_brought_to_head_and_keeps_its_events(log_target: str) -> None:
    """A log written before the TRUNCATE guard (0002) opens, migrates and keeps every row."""
    with EventStore.open(log_target) as store:
        store.append("s/a", [Note("old")], expected_version=0)
        cfg = Config()
        cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
        with store._engines.writer.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0001")
    with EventStore.open(log_target) as store:
        assert [r.event for r in store.read_all()] == [Note("old")]
        with store._engines.reader.connect() as conn:
            assert current_revision(conn) == "0002"
