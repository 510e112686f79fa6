"""The dashboard at ``/`` in a real headless Chromium, against a live ``hostler serve``.

A real daemon (real ``llama-server`` engines of tiny models) serves the page; Chromium loads
it: the running engine must appear with its state, then an engine loaded through the API must
appear in the live event tail (``/api/events``) without a reload. A daemon that needs its token
for reads (listening beyond loopback) is read with the token from the URL fragment. A
screenshot is written beside the test's files (``HOSTLER_KEEP_DASHBOARD=PATH`` keeps a copy).

Chromium is Debian's (``chromium`` and ``chromium-driver``): ``python3 dev.py test`` installs
them when it runs as root; when they are missing these tests fail, saying how to install them.
They never skip: a dashboard nobody opened is not tested.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from _rigs import room_for
from hostler.testing.tiny_gguf import write_tiny_llama

from _daemons import first_launch_costs, kill_leftovers, served_port, start_daemon

pytestmark = pytest.mark.slow

#: Where Debian puts them; PATH is searched first.
CHROMIUM = ("chromium", "/usr/bin/chromium", "chromium-browser")
CHROMEDRIVER = ("chromedriver", "/usr/bin/chromedriver")
INSTALL = (
    "the dashboard tests need Debian's Chromium and its driver: run `apt-get install -y "
    "chromium chromium-driver` (as root; `python3 dev.py test` does it when run as root)"
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1760",
)


def found(names: tuple[str, ...]) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    """Headless Chromium with a fresh profile; the test FAILS (never skips) without it."""
    binary, driver = found(CHROMIUM), found(CHROMEDRIVER)
    if binary is None or driver is None:
        pytest.fail(f"{INSTALL} (missing: {'chromium' if binary is None else 'chromedriver'})")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    try:
        made = webdriver.Chrome(options=options, service=Service(driver))
    except WebDriverException as exc:
        pytest.fail(f"Chromium would not start ({exc.msg}); {INSTALL}")
    try:
        yield made
    finally:
        made.quit()


MODELS = ("alpha", "beta", "gamma")


def write_config(tmp_path: Path) -> Path:
    for name in MODELS:
        write_tiny_llama(tmp_path / f"{name}.gguf")
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        + "".join(
            f'\n[[engines]]\nkey = "llamacpp:{n}:0"\nmodel = "{n}.gguf"\nctx = 512\n'
            "autostart = false\n"
            for n in MODELS
        )
    )
    return config


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``hostler serve`` on a loopback port: its base URL and data directory."""
    yield from serve(tmp_path, "127.0.0.1")


def room_for_two(tmp_path: Path) -> str:
    """A budget (GiB) with room for two of the tiny engines, never three, on this build."""
    probe = tmp_path / "probe"
    probe.mkdir()
    write_tiny_llama(probe / "alpha.gguf")
    config = probe / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n\n[[engines]]\n'
        'key = "llamacpp:alpha:0"\nmodel = "alpha.gguf"\nctx = 512\n'
    )
    costs = first_launch_costs(config, probe / "data", probe / "ledger.db", "llamacpp:alpha:0")
    return repr(room_for(2, *costs) // 2**20 / 1024)  # whole MiB: exact in GiB


def serve(tmp_path: Path, host: str) -> Iterator[tuple[str, Path]]:
    data, log = tmp_path / "data", tmp_path / "serve.log"
    extra = ("--host", host, "--port", "0")
    env = {"HOSTLER_CAPACITY_BUDGET_GB": room_for_two(tmp_path)}
    server = start_daemon(write_config(tmp_path), data, log, command="serve", extra=extra, env=env)
    try:
        port = served_port(log)
        yield f"http://127.0.0.1:{port}", data
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        kill_leftovers(data)


def load(base: str, data: Path, model: str) -> None:
    token = (data / "token").read_text().strip()
    answer = httpx.post(
        f"{base}/api/models/{model}/load",
        headers={"authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text


def wait(browser: webdriver.Chrome, what: str, check, timeout: float = 30) -> object:  # type: ignore[no-untyped-def]
    try:
        return WebDriverWait(browser, timeout, poll_frequency=0.1).until(check)
    except TimeoutException:
        problem = browser.find_element(By.ID, "problem").text
        raise AssertionError(f"timed out waiting for {what} (the page says: {problem!r})") from None


def engine_state(browser: webdriver.Chrome, key: str) -> str | None:
    """The state the page shows for ``key`` (None when it has no row); read in one script."""
    return engine_row(browser, key)[0]


def engine_row(browser: webdriver.Chrome, key: str) -> tuple[str | None, str]:
    """The state and text of ``key``'s row, read at once (the page redraws its tables)."""
    found = browser.execute_script(
        "const row = [...document.querySelectorAll('#engines tbody tr')]"
        ".find((r) => r.dataset.key === arguments[0]);"
        "return row ? [row.dataset.state, row.innerText] : [null, ''];",
        key,
    )
    return found[0], found[1]


def tail_types(browser: webdriver.Chrome) -> list[tuple[int, str, str]]:
    """The live tail as the page shows it: (seq, type, text), newest first."""
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#events li')]"
        ".map((li) => [Number(li.dataset.seq), li.dataset.type, li.innerText]);"
    )
    return [(int(seq), str(kind), str(text)) for seq, kind, text in rows]


def test_the_dashboard_shows_engines_and_new_events_live(
    browser: webdriver.Chrome, daemon: tuple[str, Path], tmp_path: Path
) -> None:
    base, data = daemon
    load(base, data, "alpha")
    browser.get(f"{base}/")
    assert browser.title == "hostler"
    wait(browser, "alpha running", lambda b: engine_state(b, "llamacpp:alpha:0") == "running")
    _, text = engine_row(browser, "llamacpp:alpha:0")
    assert "MiB" in text and "running" in text
    assert "committed of a" in browser.find_element(By.ID, "budget-text").text
    wait(browser, "the recent events", lambda b: len(tail_types(b)) > 0)
    before = max(seq for seq, _, _ in tail_types(browser))
    # a new event, caused through the API while the page is open: it arrives by the stream
    load(base, data, "beta")
    wait(
        browser,
        "beta's ready event in the tail",
        lambda b: any(
            seq > before and kind == "engine.ready" and "llamacpp:beta:0" in text
            for seq, kind, text in tail_types(b)
        ),
    )
    wait(browser, "beta running", lambda b: engine_state(b, "llamacpp:beta:0") == "running")
    wait(
        browser,
        "the timeline picture",
        lambda b: b.execute_script(
            "const i = document.getElementById('timeline'); return i.complete && i.naturalWidth"
        ),
    )
    # a third engine does not fit: one is evicted for it, and the page says so
    load(base, data, "gamma")
    wait(browser, "gamma running", lambda b: engine_state(b, "llamacpp:gamma:0") == "running")
    wait(
        browser,
        "the eviction in the tail",
        lambda b: any(
            kind == "engine.stop_requested" and "reason=evicted" in text
            for _, kind, text in tail_types(b)
        ),
    )
    states = {k: engine_state(browser, f"llamacpp:{k}:0") for k in MODELS}
    assert sorted(str(v) for v in states.values()) == ["running", "running", "stopped"], states
    victim = next(k for k, state in states.items() if state == "stopped")
    assert "evicted for llamacpp:gamma:0" in engine_row(browser, f"llamacpp:{victim}:0")[1]
    svg = httpx.get(f"{base}/api/timeline.svg?minutes=5", timeout=60)
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    ids = {e.get("id") for e in ET.fromstring(svg.content).iter()}  # noqa: S314 - our own
    assert {f"engine-llamacpp:{k}:0" for k in MODELS} | {"budget"} <= ids
    assert any(str(i).startswith("marker-evicted-") for i in ids)
    time.sleep(2.5)  # the page redraws its timeline 2 s after the last event it saw
    seqs = [seq for seq, _, _ in tail_types(browser)]
    assert seqs == sorted(seqs, reverse=True) and len(seqs) == len(set(seqs))  # newest first, once
    assert browser.find_element(By.ID, "problem").get_attribute("hidden") is not None
    shot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG")
    if target := os.environ.get("HOSTLER_KEEP_DASHBOARD"):
        shutil.copyfile(shot, target)


def test_a_daemon_that_needs_its_token_for_reads_is_read_with_the_fragments_token(
    browser: webdriver.Chrome, tmp_path: Path
) -> None:
    for base, data in serve(tmp_path, "0.0.0.0"):  # noqa: S104 - beyond loopback: reads need the token
        assert httpx.get(f"{base}/api/engines", timeout=30).status_code == 401
        assert httpx.get(f"{base}/", timeout=30).status_code == 200  # the page holds no data
        load(base, data, "alpha")
        browser.get(f"{base}/")
        wait(
            browser,
            "the refusal",
            lambda b: "needs its token" in b.find_element(By.ID, "problem").text,
        )
        assert engine_state(browser, "llamacpp:alpha:0") is None
        token = (data / "token").read_text().strip()
        browser.get(f"{base}/#token={token}")
        wait(browser, "alpha running", lambda b: engine_state(b, "llamacpp:alpha:0") == "running")
        assert token not in browser.current_url  # taken out of the address bar
        wait(browser, "the event tail", lambda b: len(tail_types(b)) > 0)
        answer = httpx.get(f"{base}/api/timeline.svg?minutes=5", timeout=30)
        assert answer.status_code == 401
