"""EV1: eviction policies a plugin registers, checked like engines (one bad plugin, alone)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from hostler.capacity.victims import Resident, choose_victims
from hostler.pluginhost import PluginHost
from hostler.policies.eviction import eviction_policy

MODULES = {
    "good": """
        from hostler.plugin import hookimpl
        from hostler.policies.eviction import RankedPolicy

        @hookimpl
        def register_eviction_policies(register):
            register(RankedPolicy("biggest-first", 2, lambda r: (-r.bytes, r.key)))
    """,
    "steals": """
        from hostler.plugin import hookimpl
        from hostler.policies.eviction import RankedPolicy

        @hookimpl
        def register_eviction_policies(register):
            register(RankedPolicy("lru", 9, lambda r: r.key))
    """,
    "not_a_policy": """
        from hostler.plugin import hookimpl

        @hookimpl
        def register_eviction_policies(register):
            register("lru-please")
    """,
    "bad_name": """
        from hostler.plugin import hookimpl
        from hostler.policies.eviction import RankedPolicy

        @hookimpl
        def register_eviction_policies(register):
            register(RankedPolicy("Big Policy", 1, lambda r: r.key))
    """,
    "raises": """
        from hostler.plugin import hookimpl

        @hookimpl
        def register_eviction_policies(register):
            raise RuntimeError("no policy today")
    """,
}


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PluginHost]:
    for name, text in MODULES.items():
        (tmp_path / f"evict_{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    points = [EntryPoint(n, f"evict_{n}", "hostler") for n in MODULES]
    yield PluginHost(entry_points_source=lambda: points).load()
    for name in MODULES:
        sys.modules.pop(f"evict_{name}", None)


def test_a_plugin_policy_is_registered_and_used(host: PluginHost) -> None:
    assert sorted(host.eviction_policies) == ["biggest-first"]
    policy = eviction_policy("biggest-first", host.eviction_policies)
    residents = [
        Resident("small", 10, busy=False, draining=False, recent_hits=0, last_used_at=0.0),
        Resident("big", 30, busy=False, draining=False, recent_hits=9, last_used_at=99.0),
    ]
    assert choose_victims(residents, 5, policy).victims == ("big",)
    assert choose_victims(residents, 5).victims == ("small",)  # the default: demand-lru


def test_each_bad_policy_plugin_is_disabled_alone(host: PluginHost) -> None:
    errors = {name: host.plugins[name].error for name in MODULES if name != "good"}
    assert host.plugins["good"].status == "ok"
    assert all(host.plugins[name].status == "failed" for name in errors)
    assert "eviction policy 'lru' is already registered" in errors["steals"]
    assert "'lru-please', which is not an eviction policy" in errors["not_a_policy"]
    assert "name 'Big Policy' is not" in errors["bad_name"]
    assert errors["raises"] == "register_eviction_policies: RuntimeError: no policy today"
    assert eviction_policy("lru").version == 1  # the built-in stays
