"""The chaos harness in CI (``tests/chaos/_chaos.py``): daemon SIGKILLs at 50 seeds, and each
other fault on SQLite and on PostgreSQL; ``tox -e soak`` runs many more seeds.

A run's violations fail it with the seed to replay it by
(``HOSTLER_CHAOS_SEED=N pytest tests/chaos -k ...``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos._chaos import ChaosRun, append_report, write_models

from _daemons import kill_leftovers
from _postgres import Cluster, throwaway_cluster

pytestmark = pytest.mark.slow

#: ``tox -e soak`` multiplies the seeds of every chain (HOSTLER_CHAOS_ROUNDS, default 1).
ROUNDS = int(os.environ.get("HOSTLER_CHAOS_ROUNDS", "1"))
#: Daemon SIGKILLs: 5 chains of 10 seeds (3 on SQLite, 2 on PostgreSQL), spread over workers.
KILL_CHAINS = [(chain, "sqlite" if chain < 3 else "postgresql") for chain in range(5)]
SEEDS_PER_CHAIN = 10
OTHER_FAULTS = [
    ("engine-kill", "sqlite"),
    ("engine-kill", "postgresql"),
    ("engine-stop", "sqlite"),
    ("log-lock", "sqlite"),
    ("log-full", "sqlite"),
    ("pg-restart", "postgresql"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_models(tmp_path_factory.mktemp("chaos-models"))


@pytest.fixture
def cluster_for(request: pytest.FixtureRequest) -> Iterator[Cluster | None]:
    """A PostgreSQL server of the test's own (a fault may stop it), or None for SQLite."""
    if request.node.callspec.params.get("log") != "postgresql":
        yield None
        return
    with throwaway_cluster() as cluster:
        cluster.create_database("chaos")
        yield cluster


def _run(folder: Path, models: Path, seeds: list[int], fault: str, cluster: Cluster | None) -> None:
    """The seeds one after another on one data directory; the daemon is stopped (SIGTERM, and
    the checks of a stopped daemon) after the last, and whenever a run failed."""
    failures = []
    serve = None
    try:
        for n, seed in enumerate(seeds):
            run = ChaosRun(folder, models, seed, fault, cluster, serve=serve)
            report = run.run(seed, stop=n == len(seeds) - 1)
            serve = run.serve
            append_report(report)
            if report.violations:
                failures.append(f"seed {seed} ({fault}, {report.log}): {report.violations}")
    finally:
        if serve is not None and serve.daemon.poll() is None:
            serve.close()
            kill_leftovers(serve.data)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(("chain", "log"), KILL_CHAINS)
def test_daemon_sigkill_at_random_points(
    chain: int, log: str, tmp_path: Path, models: Path, cluster_for: Cluster | None
) -> None:
    first = chain * SEEDS_PER_CHAIN * ROUNDS
    seeds = list(range(first, first + SEEDS_PER_CHAIN * ROUNDS))
    _run(tmp_path, models, seeds, "daemon-kill", cluster_for)


@pytest.mark.parametrize(("fault", "log"), OTHER_FAULTS)
def test_each_other_fault(
    fault: str, log: str, tmp_path: Path, models: Path, cluster_for: Cluster | None
) -> None:
    base = 1000 + OTHER_FAULTS.index((fault, log)) * 100
    _run(tmp_path, models, list(range(base, base + 2 * ROUNDS)), fault, cluster_for)
