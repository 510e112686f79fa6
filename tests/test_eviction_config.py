"""``[pool] eviction`` and ``HOSTLER_EVICTION``: the eviction policy a daemon makes room with.

The file and the environment check the name's shape; the daemon, once its plugins are loaded,
checks that a policy is called so and refuses to start in one line naming the known ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hostler.cli.daemon import serve_config
from hostler.config import DaemonConfig, load_config
from hostler.errors import SettingError, UsageError
from hostler.settings_env import ENV_VARIABLES, apply_overrides, read_overrides


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hostler.toml"
    path.write_text(text)
    return path


def test_the_default_is_the_seeds_demand_weighted_lru(tmp_path: Path) -> None:
    assert DaemonConfig(data_dir=tmp_path).eviction == "demand-lru"
    assert load_config(write(tmp_path, ""), data_dir=tmp_path).eviction == "demand-lru"
    assert ENV_VARIABLES["HOSTLER_EVICTION"] == "[pool] eviction"


def test_the_file_names_the_policy(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[pool]\neviction = "lru"\n'), data_dir=tmp_path)
    assert config.eviction == "lru"
    # a plugin's policy is named the same way: whether it exists is checked at start
    plugin = load_config(write(tmp_path, '[pool]\neviction = "my-policy2"\n'), data_dir=tmp_path)
    assert plugin.eviction == "my-policy2"


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        ('[pool]\neviction = "LRU"\n', "pool.eviction: an eviction policy's name"),
        ('[pool]\neviction = ""\n', "pool.eviction: an eviction policy's name"),
        ('[pool]\neviction = "a" \n', None),
        ("[pool]\neviction = 3\n", "pool.eviction: should be a valid string"),
        ('[pool]\neviction = "' + "a" * 41 + '"\n', "pool.eviction"),
        ('[pool]\nevict = "lru"\n', "did you mean 'eviction'?"),
    ],
)
def test_the_file_refuses_a_malformed_name_in_one_line(
    tmp_path: Path, text: str, wanted: str | None
) -> None:
    path = write(tmp_path, text)
    if wanted is None:  # one letter is a name
        assert load_config(path, data_dir=tmp_path).eviction == "a"
        return
    with pytest.raises(UsageError) as refused:
        load_config(path, data_dir=tmp_path)
    assert wanted in refused.value.message and "\n" not in refused.value.message


def test_the_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[pool]\neviction = "lru"\n')
    assert serve_config(path, tmp_path, environ={}).eviction == "lru"
    env = {"HOSTLER_EVICTION": "demand-lru"}
    assert serve_config(path, tmp_path, environ=env).eviction == "demand-lru"
    assert read_overrides({"HOSTLER_EVICTION": "  "}).eviction is None  # blank: unset
    config = DaemonConfig(data_dir=tmp_path, eviction="lru")
    assert apply_overrides(config, read_overrides({})).eviction == "lru"


@pytest.mark.parametrize("value", ["LRU", "-lru", "lru policy", "l" * 41, "lru\u00e9"])
def test_the_environment_refuses_a_malformed_name(value: str) -> None:
    with pytest.raises(SettingError, match=r"^HOSTLER_EVICTION=.*an eviction policy's name"):
        read_overrides({"HOSTLER_EVICTION": value})


@pytest.mark.anyio
@pytest.mark.slow
async def test_the_daemon_makes_room_with_the_named_policy_and_refuses_an_unknown_one(
    tmp_path: Path,
) -> None:
    import hostler

    data = tmp_path / "data"
    base = f'[daemon]\nledger = "ledger.db"\ndata_dir = "{data}"\n'
    async with hostler.open_daemon(write(tmp_path, base + '[pool]\neviction = "lru"\n')) as d:
        assert d.runtime is not None and d.runtime.pool.eviction.name == "lru"
    async with hostler.open_daemon(write(tmp_path, base)) as d:
        assert d.runtime is not None and d.runtime.pool.eviction.name == "demand-lru"
    with pytest.raises(UsageError) as refused:
        async with hostler.open_daemon(write(tmp_path, base + '[pool]\neviction = "mru"\n')):
            pass
    message = refused.value.message
    assert message == (
        "[pool] eviction (or HOSTLER_EVICTION): no eviction policy is named 'mru'; "
        "known: demand-lru, lru"
    )


@pytest.mark.anyio
async def test_the_runtime_hands_its_policy_to_the_pool(tmp_path: Path) -> None:
    import hostler
    from hostler.policies.eviction import DEMAND_LRU, LRU

    with hostler.EventStore.open(tmp_path / "e.db") as store:
        runtime = hostler.Runtime(store, lambda key: None, eviction=LRU)  # type: ignore[arg-type,return-value]
        assert runtime.pool.eviction is LRU
        assert hostler.Runtime(store, lambda key: None).pool.eviction is DEMAND_LRU  # type: ignore[arg-type,return-value]
