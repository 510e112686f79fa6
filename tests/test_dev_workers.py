"""``python3 dev.py test`` runs the whole suite on every core; a named test runs as asked."""

from __future__ import annotations

import pytest

from test_dev_browser import load_dev


@pytest.mark.parametrize(
    ("args", "cores", "workers"),
    [
        ([], 2, ["-n", "3"]),
        (["-q", "-p", "no:cacheprovider"], 2, ["-n", "3"]),
        (["-k", "queue"], 16, ["-n", "8"]),  # at most eight
        ([], 1, ["-n", "2"]),
        (["tests/test_supervisor.py"], 2, []),  # a file named: as asked, serial
        (["test_supervisor.py::test_x"], 2, []),
        (["-n", "0"], 2, []),  # the caller's own choice
        (["--numprocesses=4"], 2, []),
        (["-p", "no:xdist"], 2, []),
    ],
)
def test_the_worker_count_follows_the_cores_unless_the_run_chose(
    args: list[str], cores: int, workers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = load_dev()
    monkeypatch.delenv("HOSTLER_TEST_WORKERS", raising=False)
    monkeypatch.setattr(dev.os, "cpu_count", lambda: cores)
    assert dev.test_workers(args) == workers


@pytest.mark.parametrize(("value", "workers"), [("0", []), ("1", []), ("5", ["-n", "5"])])
def test_hostler_test_workers_sets_the_count(
    value: str, workers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = load_dev()
    monkeypatch.setenv("HOSTLER_TEST_WORKERS", value)
    assert dev.test_workers([]) == workers
