"""Redaction of exports (PM41-PM43): every text field classified, paths and prompts removed."""

from __future__ import annotations

import copy
import dataclasses
import re
import types
import typing
from typing import Any

import pytest

import hostler  # noqa: F401 - registers every event type hostler writes
from hostler.events.base import Event, registered_types
from hostler.postmortem.redact import (
    FIELDS,
    METADATA_SESSION_KEYS,
    REDACTED,
    TREE_SESSIONS,
    Kind,
    Redaction,
    Redactor,
    parse_redaction,
)

from _support import REPO

ALL = Redaction(paths=True, prompts=True)
PATHS = Redaction(paths=True)
PROMPTS = Redaction(prompts=True)


def _can_hold_text(annotation: Any) -> bool:
    """Whether a field of this type can carry a string (str, str | None, list[str], dicts, Any)."""
    if annotation is str or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in {typing.Union, types.UnionType, list, tuple, dict, set, frozenset}:
        return any(_can_hold_text(arg) for arg in typing.get_args(annotation))
    return False


def unclassified(cls: type[Event]) -> list[str]:
    """The text-carrying fields of an event class that FIELDS does not classify."""
    table = FIELDS.get(cls.TYPE)
    hints = typing.get_type_hints(cls)
    return [
        f"{cls.TYPE}.{f.name}"
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if _can_hold_text(hints[f.name]) and (table is None or f.name not in table)
    ]


def shipped() -> dict[str, type[Event]]:
    """The registered event types hostler (and its bundled plugins) ship, not tests' own."""
    return {
        name: cls
        for name, cls in registered_types().items()
        if cls.__module__.split(".")[0].startswith("hostler")
    }


def test_every_text_field_of_every_registered_event_is_classified() -> None:
    assert len(shipped()) >= 50
    missing = [name for cls in shipped().values() for name in unclassified(cls)]
    assert missing == [], (
        "classify these fields in hostler.postmortem.redact.FIELDS (safe, path, text, prompt, "
        f"session or tree) and list them in docs/postmortem.md: {missing}"
    )


def test_the_classification_check_catches_a_new_text_field() -> None:
    @dataclasses.dataclass(frozen=True)
    class Later(Event):  # not registered: a stand-in for a future event class
        at: float
        note: str
        tags: list[str]
        maybe: str | None
        count: int

    Later.TYPE = "engine.crashed"  # a known type that gained fields
    assert unclassified(Later) == [
        "engine.crashed.note",
        "engine.crashed.tags",
        "engine.crashed.maybe",
    ]
    Later.TYPE = "brand.new"
    assert unclassified(Later) == ["brand.new.note", "brand.new.tags", "brand.new.maybe"]


def test_the_table_names_only_real_types_and_fields() -> None:
    known = shipped()
    assert set(FIELDS) == set(known)
    for type_name, table in FIELDS.items():
        names = {f.name for f in dataclasses.fields(known[type_name])}  # type: ignore[arg-type]
        assert set(table) <= names, type_name
    for type_name, field in TREE_SESSIONS:
        assert FIELDS[type_name][field] is Kind.TREE
    assert {"session", "session_id", "group", "holder", "label"} == METADATA_SESSION_KEYS
    assert REDACTED == "<redacted>"


def test_docs_list_every_classified_field() -> None:
    text = (REPO / "docs" / "postmortem.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([\w.]+)` \| `(\w+)` \| (\w+) \|$", text, flags=re.MULTILINE)
    expected = [
        (type_name, field, kind.value)
        for type_name, table in FIELDS.items()
        for field, kind in table.items()
        if field not in {"from_state", "to_state"}
    ]
    assert rows == expected
    assert all(
        table[state] is Kind.SAFE
        for table in FIELDS.values()
        for state in ("from_state", "to_state")
        if state in table
    )


def test_parse_redaction() -> None:
    assert parse_redaction("paths") == PATHS
    assert parse_redaction("prompts") == PROMPTS
    assert parse_redaction("prompts,paths") == ALL
    assert parse_redaction(" paths , prompts ") == ALL
    assert parse_redaction("all") == ALL
    assert parse_redaction("all,paths") == ALL
    assert parse_redaction("none") == Redaction()
    assert ALL.names == ["paths", "prompts"] and Redaction().names == []
    assert ALL.any and PATHS.any and PROMPTS.any and not Redaction().any
    for bad in ("", ",", "path", "paths,secrets"):
        with pytest.raises(ValueError, match="redact paths, prompts"):
            parse_redaction(bad)
    with pytest.raises(ValueError, match=r"^path, secrets:"):
        parse_redaction("path,secrets")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/home/u/models/qwen-00001-of-00002.gguf", "<path:1>.gguf"),
        ("error: '/home/u/x.gguf': No such file", "error: '<path:1>.gguf': No such file"),
        ('open "/a/b.bin" failed', 'open "<path:1>.bin" failed'),
        ("see ~/models/a.gguf.", "see <path:1>.gguf."),
        ("in ~me/w/x.txt", "in <path:1>.txt"),
        ("GGML_ASSERT at /src/ggml.c:123:7", "GGML_ASSERT at <path:1>.c:123:7"),
        ("(/opt/llama/bin/llama-server)", "(<path:1>)"),
        ("./run/x and ../up/y.log", "<path:1> and <path:2>.log"),
        ("C:\\models\\m.gguf", "<path:1>.gguf"),
        ("\\\\server\\share\\m.gguf", "<path:1>.gguf"),
        ("file:///tmp/a.txt", "file://<path:1>.txt"),
        ("models/x.gguf and a/b/c", "<path:1>.gguf and <path:2>"),
        ("/home/u/dir/ then /home/u/dir", "<path:1> then <path:1>"),
        ("/a/.hidden", "<path:1>"),
        # not paths: kept as they are
        ("engine/llamacpp:qwen:0 crashed", "engine/llamacpp:qwen:0 crashed"),
        ("lease/3 broken, queue/x/y held", "lease/3 broken, queue/x/y held"),
        ("http://127.0.0.1:8080/health ok", "http://127.0.0.1:8080/health ok"),
        ("8.5 tokens/s, 512/1024 and GiB/s", "8.5 tokens/s, 512/1024 and GiB/s"),
        ("ratio 3 / 4", "ratio 3 / 4"),
        ("a / and ./ alone", "a / and ./ alone"),
        ("", ""),
    ],
)
def test_paths_in_text_become_pseudonyms(text: str, expected: str) -> None:
    redactor = Redactor(PATHS)
    assert redactor.payload("engine.failed", {"error": text})["error"] == expected


def test_the_same_path_keeps_its_pseudonym_and_numbers_follow_first_appearance() -> None:
    redactor = Redactor(ALL)
    first = redactor.payload("daemon.reaped", {"command": "/bin/llama -m /m/q.gguf"})
    again = redactor.payload("engine.failed", {"error": "cannot map /m/q.gguf", "decision": None})
    other = redactor.payload("engine.failed", {"error": "/m/r.gguf", "decision": None})
    assert first == {"command": "<path:1> -m <path:2>.gguf"}
    assert again["error"] == "cannot map <path:2>.gguf"
    assert other["error"] == "<path:3>.gguf"
    twin = Redactor(ALL)  # deterministic: the same rows, the same export
    assert twin.payload("daemon.reaped", {"command": "/bin/llama -m /m/q.gguf"}) == first


def test_a_path_field_without_a_slash_is_one_path() -> None:
    redactor = Redactor(PATHS)
    payload = {"engine_key": "k:m:0", "model": "qwen.gguf", "build": "b4000", "kv_type": "f16"}
    assert redactor.payload("calibration.measured", payload) == {
        "engine_key": "k:m:0",
        "model": "<path:1>.gguf",
        "build": "b4000",  # text: a build name is no path
        "kv_type": "f16",
    }
    assert redactor.payload("daemon.reaped", {"command": ""}) == {"command": ""}


def _enqueued(session: str | None, label: str | None, group: str | None = None) -> dict[str, Any]:
    return {
        "engine": "e:m:0",
        "id": 1,
        "lane": "interactive",
        "ambient": False,
        "session_id": session,
        "group": group,
        "label": label,
        "at": 1.0,
    }


def test_prompts_remove_labels_and_tails_and_pseudonymise_sessions() -> None:
    redactor = Redactor(PROMPTS)
    assert redactor.payload("queue.enqueued", _enqueued("alice", "write /a/b.txt", "team")) == {
        **_enqueued("<session:1>", REDACTED, "<session:2>"),
    }
    assert redactor.payload("queue.enqueued", _enqueued(None, None)) == _enqueued(None, None)
    bound = redactor.payload(
        "router.bound",
        {"at": 1.0, "session": "alice", "key": "e:m:0", "how": "first", "sessions": {"e:m:0": 1}},
    )
    assert bound["session"] == "<session:1>" and bound["sessions"] == {"e:m:0": 1}
    lease = redactor.payload(
        "lease.requested",
        {"from_state": "idle", "to_state": "waiting", "at": 1.0, "slot": "image", "holder": "bob"},
    )
    assert lease["holder"] == "<session:3>" and lease["slot"] == "image"
    crashed = redactor.payload(
        "engine.crashed", {"panic_line": "at /x/y.c", "output_tail": "hi", "panic_kind": "oom"}
    )
    # prompts alone leave paths in hostler's own text; output tails go whole
    assert crashed == {"panic_line": "at /x/y.c", "output_tail": REDACTED, "panic_kind": "oom"}


def test_paths_alone_keep_what_users_wrote_but_not_its_paths() -> None:
    redactor = Redactor(PATHS)
    assert redactor.payload("queue.enqueued", _enqueued("alice", "write /a/b.txt")) == (
        _enqueued("alice", "write <path:1>.txt")
    )
    tail = redactor.payload("engine.crashed", {"output_tail": "load /a/b.txt\nok"})
    assert tail == {"output_tail": "load <path:1>.txt\nok"}


def test_session_ids_inside_the_cache_decision_are_pseudonymised_too() -> None:
    redactor = Redactor(ALL)
    payload = {
        "key": "e:m:0",
        "ids": ["alice"],
        "reason": "watermark",
        "decision": {
            "rule": "CC9",
            "entries": [["alice", 10, 2.0, "normal"], ["bob", 5, 1.0, "low"]],
            "evicted": ["alice"],
            "total": 15,
        },
    }
    original = copy.deepcopy(payload)
    assert redactor.payload("cache.evicted", payload) == {
        "key": "e:m:0",
        "ids": ["<session:1>"],
        "reason": "watermark",
        "decision": {
            "rule": "CC9",
            "entries": [["<session:1>", 10, 2.0, "normal"], ["<session:2>", 5, 1.0, "low"]],
            "evicted": ["<session:1>"],
            "total": 15,
        },
    }
    assert payload == original  # the input is never changed
    odd = {"key": "k", "ids": [], "reason": "r", "decision": {"entries": "x", "evicted": [3]}}
    assert redactor.payload("cache.evicted", odd) == odd  # an unexpected shape is left alone


def test_trees_lose_their_paths_keys_included() -> None:
    redactor = Redactor(PATHS)
    decision = {"rule": "PP4", "/m/a.gguf": [1, "/m/a.gguf"], "n": None, "ok": True}
    assert redactor.payload("pool.room_planned", {"decision": decision}) == {
        "decision": {"rule": "PP4", "<path:1>.gguf": [1, "<path:1>.gguf"], "n": None, "ok": True}
    }


def test_unlisted_fields_and_unknown_types_are_treated_as_prompts() -> None:
    payload = {"note": "by /home/me/x.txt", "nested": {"/k/p": ["a", 1]}, "n": 2}
    assert Redactor(PROMPTS).payload("plugin.secret", payload) == {
        "note": REDACTED,
        "nested": {"/k/p": [REDACTED, 1]},
        "n": 2,
    }
    assert Redactor(PATHS).payload("plugin.secret", payload) == {
        "note": "by <path:1>.txt",
        "nested": {"<path:2>": ["a", 1]},
        "n": 2,
    }
    assert Redactor(ALL).payload("engine.ready", {"at": 1.0, "later": "s"}) == {
        "at": 1.0,
        "later": REDACTED,
    }


def test_metadata() -> None:
    meta = {"actor": "supervisor", "session": "alice", "cwd": "/home/me", "ids": {"label": "x"}}
    assert Redactor(ALL).metadata(meta) == {
        "actor": "supervisor",
        "session": "<session:1>",
        "cwd": "<path:1>",
        "ids": {"label": "x"},  # only top-level metadata keys name client ids
    }
    assert Redactor(PATHS).metadata(meta)["session"] == "alice"


def test_forgetting_memoised_text_changes_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [f"open /m/{n % 3}.gguf failed" for n in range(7)]
    expected = [Redactor(PATHS).payload("engine.failed", {"error": t}) for t in texts]
    steady = Redactor(PATHS)
    assert [steady.payload("engine.failed", {"error": t}) for t in texts] == [
        {"error": f"open <path:{n % 3 + 1}>.gguf failed"} for n in range(7)
    ]
    monkeypatch.setattr("hostler.postmortem.redact._MEMO_LIMIT", 2)
    forgetful = Redactor(PATHS)
    assert [forgetful.payload("engine.failed", {"error": t})["error"] for t in texts] == [
        e["error"] for e in [steady.payload("engine.failed", {"error": t}) for t in texts]
    ]
    assert len(forgetful._scrubbed) <= 2
    assert expected[0] == {"error": "open <path:1>.gguf failed"}


def test_a_tree_index_past_the_end_changes_nothing() -> None:
    redactor = Redactor(ALL)
    short = {"key": "k", "ids": [], "reason": "r", "decision": {"entries": [["a"]], "evicted": []}}
    out = redactor.payload("cache.evicted", short)
    assert out["decision"] == {"entries": [["<session:1>"]], "evicted": []}
    empty_row = {"key": "k", "ids": [], "reason": "r", "decision": {"entries": [[]]}}
    assert redactor.payload("cache.evicted", empty_row)["decision"] == {"entries": [[]]}


def test_no_redaction_is_a_copy() -> None:
    redactor = Redactor(Redaction())
    payload = {"error": "/a/b", "label": "x"}
    out = redactor.payload("engine.failed", payload)
    assert out == payload and out is not payload
    meta = {"session": "s"}
    assert redactor.metadata(meta) == meta and redactor.metadata(meta) is not meta
    assert redactor.raw("{bad") == "{bad" and redactor.text("/a/b") == "/a/b"


def test_damaged_columns() -> None:
    redactor = Redactor(PATHS)
    assert redactor.raw("{bad /a/b") == REDACTED
    assert redactor.raw(5) == 5
    assert redactor.text("engine/x at /a/b") == "engine/x at <path:1>"
    assert redactor.text(7) == 7


def test_every_kind_is_used() -> None:
    used = {kind for table in FIELDS.values() for kind in table.values()}
    assert used == set(Kind)
    assert [k.value for k in Kind] == ["safe", "path", "text", "prompt", "session", "tree"]


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        # each of these survived `--redact all` once (a hostile tester's list)
        ("file:/home/alice/x.gguf", "file:<path:1>.gguf"),
        ("error loading model:/home/alice/m.gguf", "error loading model:<path:1>.gguf"),
        ("cwd=C:/Users/alice/proj/m.gguf", "cwd=<path:1>.gguf"),
        ("..\\alice\\dotdot.gguf", "<path:1>.gguf"),
        ("models\\alice.gguf", "<path:1>.gguf"),
        ("smb://nas/alice/m.gguf", "smb://<path:1>.gguf"),
        ("s3://bucket/alice/m.gguf", "s3://<path:1>.gguf"),
        ("see https://example.com/alice/x", "see https://<path:1>"),
        # kept: an engine's own address, stream ids, rates, a bare scheme
        ("http://127.0.0.1:8080/health", "http://127.0.0.1:8080/health"),
        ("https://localhost/v1/models", "https://localhost/v1/models"),
        ("http://[::1]:9/x", "http://[::1]:9/x"),
        ("engine/llamacpp:m:0 at 12 tokens/s", "engine/llamacpp:m:0 at 12 tokens/s"),
        ("http://", "http://"),
    ],
)
def test_paths_in_every_spelling_are_redacted(text: str, redacted: str) -> None:
    assert Redactor(Redaction(paths=True, prompts=False)).text(text) == redacted
