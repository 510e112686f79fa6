"""``python3 dev.py test`` stopped by a signal stops the run it started, all of it.

Break (issue 19): a SIGINT or SIGTERM sent to dev.py alone (a CI runner's cancel, ``kill PID``)
ended dev.py at once and left pytest, its workers, their daemons and engines running until the
run finished by itself. dev.py now runs its command in a process group of its own and passes
such a signal to the whole group as SIGINT, pytest's orderly stop (the session guard ends what
the run started); a second signal kills the group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _support import REPO

#: A command that starts a grandchild in its own group and waits, as pytest waits on workers.
CHILD = """
import signal, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", GRANDCHILD, sys.argv[1]])
try:
    grandchild.wait()
except KeyboardInterrupt:
    grandchild.wait()
    sys.exit(130)
"""
GRANDCHILD = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(signum, frame):
    out.with_suffix(".got").write_text(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
out.write_text("ready")
while True:
    time.sleep(60)
"""
DRIVER = """
import os, sys
sys.path.insert(0, os.environ["REPO"])
import dev
sys.exit(dev.run_forwarding([sys.executable, "-c", os.environ["CHILD"], sys.argv[1]], dict(os.environ)))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_dev_py_alone_stops_the_whole_run(tmp_path: Path, sig: signal.Signals) -> None:
    marker = tmp_path / "grandchild.txt"
    env = {
        **os.environ,
        "REPO": str(REPO),
        "CHILD": CHILD.replace("GRANDCHILD", repr(GRANDCHILD)),
    }
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(marker)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():  # the grandchild is up and has its handler
            assert driver.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(driver.pid, sig)  # to dev.py alone, not to its group
        assert driver.wait(60) == 130  # the command's own answer to its orderly stop
        assert marker.with_suffix(".got").read_text() == "SIGINT"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
