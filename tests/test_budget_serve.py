"""A real ``hostler serve`` refusing for want of memory names the budget's own setting (CB13).

What a new user met: ``[budget] bytes`` of 1 GiB in the config, a model priced over it, and a
503 telling them to raise ``HOSTLER_CAPACITY_BUDGET_GB`` — which, set, changed nothing (the
config's budget wins). Here the 503 the official ``openai`` client gets names the config file
and its key; with the variable set too, still the file, and that the variable does not apply;
a budget under 1 GiB is refused where it is given (CB1), by ``hostler budget --set`` and by
``PUT /api/budget``; a budget set live is named as set live.

The model is a tiny real GGUF (10 MB) with a KV cache of 22 KiB a token, configured for a
window of 65536 tokens: ``hostler preview`` reserves 1.5 GiB for it, over the budget even at
one slot, so the refusal comes before any engine process starts.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama

from _daemons import ServeChild, kill_leftovers
from _support import run_cli

pytestmark = pytest.mark.slow

GIB = 2**30
MODEL = '[[models]]\nid = "big"\npath = "big.gguf"\nctx = 65536\nkv_type = "f16"\n'
#: 44 layers of 2 KV heads of 64: 22 KiB of f16 KV a token.
DEEP = TinyModel(layers=44, embd=128, heads=2, kv_heads=2, ff=128, ctx=131072, f16=True)
CONFIG_BUDGET = f"[budget]\nbytes = {GIB}\n"
LIVE = "`hostler budget --set SIZE` (PUT /api/budget)"


def _serve(folder: Path, env: dict[str, str] | None = None) -> ServeChild:
    folder.mkdir()
    write_tiny_llama(folder / "big.gguf", DEEP)
    return ServeChild(folder, MODEL, CONFIG_BUDGET, env={**(env or {})})


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServeChild]:
    child = _serve(tmp_path / "plain")
    try:
        yield child
    finally:
        child.close()
        kill_leftovers(child.data)


def _refusal(child: ServeChild) -> str:
    """The message of the 503 the openai client gets for ``big``."""
    client = openai.OpenAI(base_url=f"{child.base}/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model="big", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert caught.value.status_code == 503, caught.value.message
    body = caught.value.body
    assert isinstance(body, dict), body
    message = body["message"]
    assert isinstance(message, str) and "\n" not in message
    return message


def _put_budget(child: ServeChild, size: int) -> tuple[int, dict[str, object]]:
    token = (child.data / "token").read_text().strip()
    request = urllib.request.Request(
        f"{child.base}/api/budget",
        data=json.dumps({"bytes": size}).encode(),
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
        method="PUT",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_the_503_names_the_config_file_and_key_and_a_live_budget_as_set_live(
    served: ServeChild,
) -> None:
    config = served.config.resolve()
    message = _refusal(served)
    assert message.startswith("llamacpp:big:0: needs 1.4"), message
    assert (
        f"nothing was unloaded. The budget, 1.0 GiB, is set in {config} ([budget] bytes): raise "
        f"it there and restart hostler, or raise it live until the next start with {LIVE}; or "
        "stop what else holds memory (hostler state shows it)"
    ) in message
    assert "HOSTLER_CAPACITY_BUDGET_GB" not in message  # not set here: not named

    # CB1: under 1 GiB is refused where it is given, before the daemon is asked
    small = run_cli("budget", "--url", served.base, "--set", "100MiB")
    assert small.returncode == 2, small
    assert small.stderr == (
        "hostler: error [usage.invalid]: --set: 104857600 bytes is under 1 GiB (1073741824 "
        "bytes), the smallest budget hostler enforces (CB1: a smaller one would let every model "
        "start); give at least 1 GiB, or auto for the automatic budget\n"
    )
    status, answer = _put_budget(served, 100 * 2**20)
    assert status == 400, answer
    error = answer["error"]
    assert isinstance(error, dict) and error["code"] == "invalid-request"
    assert str(error["message"]).startswith("104857600 bytes is under 1 GiB (1073741824 bytes)")
    assert served.get("/api/budget")["budget"] == GIB  # unchanged by either

    # set live: a 503 then names the live setting
    live = run_cli(
        "budget", "--url", served.base, "--set", "1280MiB", "--data-dir", str(served.data)
    )
    assert live.returncode == 0, live.stderr
    assert served.get("/api/budget")["budget"] == 1280 * 2**20
    assert (
        f"nothing was unloaded. The budget, 1.3 GiB, was set live with {LIVE}: raise it the "
        "same way, or go back to the automatic one with `hostler budget --set auto`; or stop "
        "what else holds memory"
    ) in _refusal(served)


def test_the_config_budget_wins_over_the_variable_and_the_503_says_so(tmp_path: Path) -> None:
    child = _serve(tmp_path / "both", env={"HOSTLER_CAPACITY_BUDGET_GB": "4"})
    try:
        budget = child.get("/api/budget")
        assert (budget["budget"], budget["auto_budget"]) == (GIB, 4 * GIB)  # the file wins
        message = _refusal(child)
        assert (
            f"The budget, 1.0 GiB, is set in {child.config.resolve()} ([budget] bytes): raise it "
            f"there and restart hostler, or raise it live until the next start with {LIVE}; "
            "HOSTLER_CAPACITY_BUDGET_GB (4.0 GiB) does not apply while this budget is set; or "
            "stop what else holds memory (hostler state shows it)"
        ) in message
        assert "Raise the budget (HOSTLER_CAPACITY_BUDGET_GB)" not in message
    finally:
        child.close()
        kill_leftovers(child.data)
