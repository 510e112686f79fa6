"""Redaction of exported events: filesystem paths and what users wrote (pure, deterministic).

Every string field of every registered event is classified in :data:`FIELDS` (PM41):

* ``safe``: made by hostler from its own vocabulary or identities (engine keys, states, rule
  names, launch tokens); kept under every redaction.
* ``path``: a filesystem path, a file name or a command line; under ``paths`` each path in it
  becomes a stable pseudonym, ``<path:N>`` plus the basename's extension (PM42), and a value
  without any path-shaped part is taken whole as one.
* ``text``: prose made by hostler or an engine (errors, causes, panic lines) that may embed
  paths; under ``paths`` the paths in it are replaced, the rest is kept.
* ``prompt``: text a user wrote or a model produced (queue labels, an engine's output tail);
  under ``prompts`` it is replaced by ``<redacted>``, under ``paths`` alone its paths are.
* ``session``: an identifier a client chose that is compared for equality (session ids,
  request groups, lease holders); under ``prompts`` it becomes ``<session:N>`` (the same id,
  the same pseudonym, everywhere in one export), under ``paths`` alone its paths are replaced.
* ``tree``: nested JSON made by hostler (decisions, plans); under ``paths`` every string in it
  (keys too) has its paths replaced; under ``prompts`` the places :data:`TREE_SESSIONS` names
  hold session ids and are pseudonymised.

A field not in the table (a plugin's event, a newer schema) is treated as ``prompt`` when it is
a string and as ``tree`` with every string a prompt otherwise (PM43): nothing leaks by omission.
A :class:`Redactor` keeps the pseudonyms of one export; it does no I/O and reads no clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "FIELDS",
    "METADATA_SESSION_KEYS",
    "REDACTED",
    "TREE_SESSIONS",
    "Kind",
    "Redaction",
    "Redactor",
    "parse_redaction",
]

#: What a removed text reads as.
REDACTED = "<redacted>"


class Kind(StrEnum):
    """How one event field is redacted (see the module docstring)."""

    SAFE = "safe"
    PATH = "path"
    TEXT = "text"
    PROMPT = "prompt"
    SESSION = "session"
    TREE = "tree"


S, P, T, U, Q, J = Kind.SAFE, Kind.PATH, Kind.TEXT, Kind.PROMPT, Kind.SESSION, Kind.TREE
_STATES = {"from_state": S, "to_state": S}

#: Every string-carrying field of every event hostler ships, by event type (PM41). Fields of
#: other types (numbers, booleans) need no entry. ``tests/test_redact.py`` fails when a
#: registered event has a text field missing here.
FIELDS: Mapping[str, Mapping[str, Kind]] = {
    "cache.budget_set": {"key": S},
    "cache.evicted": {"key": S, "ids": Q, "reason": S, "decision": J},
    "cache.restored": {"key": S, "session": Q, "error": T},
    "cache.saved": {"key": S, "session": Q, "cause": S, "error": T},
    "calibration.measured": {"engine_key": S, "model": P, "build": T, "kv_type": S},
    "cpu.unsupported": {
        "key": S,
        "build": T,
        "cpu": S,
        "what": S,
        "kv_type": S,
        "model": P,
        "message": T,
    },
    "daemon.gap": {},
    "daemon.log_recovered": {"error": T, "code": S},
    "daemon.reaped": {"launch_token": S, "command": P},
    "daemon.started": {"version": S, "adopted": S, "lost": S, "ledger": P, "ledger_owner": S},
    "daemon.stopped": {},
    "device.sampled": {"gpus": J, "gpu_note": T},
    "engine.adopted": _STATES,
    "engine.adoption_started": _STATES,
    "engine.crashed": {**_STATES, "panic_kind": S, "panic_line": T, "output_tail": U},
    "engine.failed": {**_STATES, "error": T, "decision": J},
    "engine.lost": {**_STATES, "cause": T},
    "engine.ready": _STATES,
    "engine.reset": {**_STATES, "cause": T},
    "engine.spawned": {
        **_STATES,
        "boot_id": S,
        "launch_token": S,
        "argv_fingerprint": S,
        "launched": J,
    },
    "engine.start_requested": {**_STATES, "cause": T},
    "engine.stop_failed": {**_STATES, "detail": T},
    "engine.stop_requested": {**_STATES, "reason": T, "decision": J},
    "engine.stopped": {**_STATES, "detail": T},
    "lease.broken": {**_STATES, "reason": T},
    "lease.granted": _STATES,
    "lease.released": {**_STATES, "cause": T},
    "lease.requested": {**_STATES, "slot": S, "holder": Q},
    "ledger.adopted": {"key": S, "owner": S, "from_owner": S, "token": S},
    "ledger.bound": {"key": S, "owner": S},
    "ledger.budget_set": {"source": T},
    "ledger.carried": {"key": S, "owner": S, "token": S, "carried_by": S},
    "ledger.denied": {"key": S, "owner": S, "reason": T},
    "ledger.measured": {"key": S, "owner": S},
    "ledger.released": {"key": S, "owner": S, "cause": T},
    "ledger.reserved": {"key": S, "owner": S, "token": S},
    "ledger.spillover_set": {},
    "models.offered": {"added": J, "removed": J, "refused": J},
    "offload.degraded": {"key": S, "panic_kind": S, "previous": J, "plan": J},
    "plugin.failed": {"name": S, "version": S, "stage": S, "error": T},
    "plugin.loaded": {"name": S, "version": S, "engines": S},
    "pool.drain_ended": {"key": S, "outcome": S, "decision": J},
    "pool.drain_started": {"key": S, "for_key": S},
    "pool.room_planned": {"for_key": S, "evict": S, "drain": S, "decision": J},
    "queue.cancelled": {"engine": S, "lane": S, "why": S},
    "queue.dispatched": {"engine": S, "lane": S, "decision": J},
    "queue.served": {"engine": S, "lane": S},
    "queue.enqueued": {"engine": S, "lane": S, "session_id": Q, "group": Q, "label": U},
    "queue.moved": {"engine": S, "direction": S},
    "queue.released": {"engine": S, "lane": S},
    "reservation.denied": {**_STATES, "reason": T},
    "reservation.granted": _STATES,
    "reservation.released": {**_STATES, "cause": T},
    "reservation.requested": {**_STATES, "owner": S},
    "router.bound": {"session": Q, "key": S, "how": S, "sessions": J},
}

#: Where a ``tree`` field holds session ids: steps into the JSON (a key, a list index, or
#: ``*`` for every element of a list). CC9's decision lists each cache entry's session.
TREE_SESSIONS: Mapping[tuple[str, str], tuple[tuple[str | int, ...], ...]] = {
    ("cache.evicted", "decision"): (("entries", "*", 0), ("evicted", "*")),
}

#: Metadata keys whose values a client chose; pseudonymised under ``prompts``.
METADATA_SESSION_KEYS = frozenset({"session", "session_id", "group", "holder", "label"})

#: First segments of stream ids (``engine/KEY``): a relative token starting with one in prose
#: is a stream, not a path.
_STREAM_FAMILIES = frozenset(
    {
        "cache",
        "calibration",
        "daemon",
        "device",
        "engine",
        "lease",
        "ledger",
        "offload",
        "plugins",
        "pool",
        "queue",
        "reservation",
        "router",
    }
)

_PATH_CHARS = r"[^\s'\"<>|;,()\[\]{}]"
_TOKEN = re.compile(
    rf"""
    (?P<url>\b[A-Za-z][A-Za-z0-9+.-]*://{_PATH_CHARS}*)
    | (?P<abs>
        (?<![\w.~/\\-])(?:~[\w.-]*|\.\.?)?/{_PATH_CHARS}+
      | (?<![\w\\])[A-Za-z]:[\\/]{_PATH_CHARS}*
      | (?<![\w\\])\\\\{_PATH_CHARS}+
      | (?<![\w.~/\\-])(?:\.\.?|[\w.-]+)(?:\\[\w.-]+)+\\?
      )
    | (?P<rel>(?<![\w.~:/\\-])[\w.-]+(?:/[\w.-]+)+/?(?=$|[\s'"<>|;,()\[\]{{}}:]))
    """,
    re.VERBOSE,
)
_TRAILING = ".,:;!?'\")]}"
#: http(s) to this machine itself (an engine's port): kept whole by the path redaction.
_LOOPBACK_WEB = re.compile(
    r"https?://(?:localhost|127(?:\.\d{1,3}){3}|\[::1\])(?::\d+)?(?:[/?#]|$)", re.IGNORECASE
)
_EXTENSION = re.compile(r"(?<=[^.])\.[A-Za-z0-9]{1,8}$")
_LETTER = re.compile(r"[A-Za-z]")
_MEMO_LIMIT = 10_000
_LINE_NUMBER = re.compile(r"(?::\d+)+$")


@dataclass(frozen=True, slots=True)
class Redaction:
    """Which redactions an export applies.

    Attributes:
        paths: Filesystem paths become stable pseudonyms.
        prompts: What users wrote is removed; session ids become pseudonyms.
    """

    paths: bool = False
    prompts: bool = False

    @property
    def names(self) -> list[str]:
        """The applied redactions, as the export header lists them (sorted)."""
        return [name for name, on in (("paths", self.paths), ("prompts", self.prompts)) if on]

    @property
    def any(self) -> bool:
        """Whether anything is redacted at all."""
        return self.paths or self.prompts


def parse_redaction(text: str) -> Redaction:
    """``--redact`` as given: ``paths``, ``prompts``, both comma-separated, ``all`` or ``none``.

    Raises:
        ValueError: A name that is none of these (the message lists them).
    """
    names = {part.strip() for part in text.split(",") if part.strip()}
    known = {"paths", "prompts", "all", "none"}
    unknown = sorted(names - known)
    if unknown or not names:
        shown = ", ".join(unknown) or repr(text)
        raise ValueError(f"{shown}: redact paths, prompts, paths,prompts, all or none")
    if "all" in names:
        return Redaction(paths=True, prompts=True)
    return Redaction(paths="paths" in names, prompts="prompts" in names)


class Redactor:
    """Redacts payloads and metadata for one export; keeps its pseudonyms consistent.

    The same path (the same session id) always gets the same pseudonym from one redactor,
    numbered by first appearance, so two exports of the same rows read the same.
    """

    def __init__(self, redaction: Redaction) -> None:
        self.redaction = redaction
        self._paths: dict[str, int] = {}
        self._sessions: dict[str, str] = {}
        self._scrubbed: dict[str, str] = {}  # text -> text: logs repeat their messages

    # -- events ------------------------------------------------------------------------

    def payload(self, type_name: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        """A redacted copy of an event's payload (the payload itself is not changed)."""
        if not self.redaction.any:
            return dict(payload)
        table = FIELDS.get(type_name, {})
        out: dict[str, Any] = {}
        for name, value in payload.items():
            kind = table.get(name)
            if kind is Kind.TREE:
                out[name] = self._tree(value, TREE_SESSIONS.get((type_name, name), ()))
            elif kind is None:
                out[name] = self._unlisted(value)
            else:
                out[name] = self._value(kind, value)
        return out

    def metadata(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """A redacted copy of a row's metadata (client-chosen ids pseudonymised, paths out)."""
        if not self.redaction.any:
            return dict(metadata)
        out: dict[str, Any] = {}
        for key, value in metadata.items():
            if key in METADATA_SESSION_KEYS:
                out[key] = self._value(Kind.SESSION, value)
            else:
                out[self._scrub(key)] = self._tree(value, ())
        return out

    def raw(self, value: Any) -> Any:
        """A damaged payload or metadata column as stored, removed under any redaction.

        Text that cannot be read cannot be classified.
        """
        if self.redaction.any and isinstance(value, str):
            return REDACTED
        return value

    def text(self, value: Any) -> Any:
        """Another column of a damaged row (stream, type, time): its paths replaced."""
        return self._scrub(value) if isinstance(value, str) else value

    # -- the kinds -------------------------------------------------------------------

    def _value(self, kind: Kind, value: Any) -> Any:
        if isinstance(value, list):
            return [self._value(kind, item) for item in value]
        if not isinstance(value, str) or kind is Kind.SAFE:
            return value
        if kind is Kind.PROMPT:
            return REDACTED if self.redaction.prompts else self._scrub(value)
        if kind is Kind.SESSION:
            return self.session(value) if self.redaction.prompts else self._scrub(value)
        if kind is Kind.PATH and self.redaction.paths:
            scrubbed = self._scrub(value)
            return self.path(value) if scrubbed == value and value else scrubbed
        return self._scrub(value)

    def _unlisted(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._value(Kind.PROMPT, value)
        if isinstance(value, list):
            return [self._unlisted(item) for item in value]
        if isinstance(value, dict):
            return {self._scrub(str(k)): self._unlisted(v) for k, v in value.items()}
        return value

    def _tree(self, value: Any, sessions: tuple[tuple[str | int, ...], ...]) -> Any:
        scrubbed = self._scrub_tree(value)
        if self.redaction.prompts:
            for steps in sessions:
                scrubbed = self._at(scrubbed, steps)
        return scrubbed

    def _scrub_tree(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._scrub(value)
        if isinstance(value, list):
            return [self._scrub_tree(item) for item in value]
        if isinstance(value, dict):
            return {self._scrub(str(k)): self._scrub_tree(v) for k, v in value.items()}
        return value

    def _at(self, value: Any, steps: tuple[str | int, ...]) -> Any:
        """``value`` with the strings at ``steps`` pseudonymised as sessions."""
        if not steps:
            return self.session(value) if isinstance(value, str) else value
        step, rest = steps[0], steps[1:]
        if step == "*" and isinstance(value, list):
            return [self._at(item, rest) for item in value]
        if isinstance(step, int) and isinstance(value, list):  # an index past the end: no-op
            return [self._at(item, rest) if n == step else item for n, item in enumerate(value)]
        if isinstance(step, str) and isinstance(value, dict) and step in value:
            return {k: self._at(v, rest) if k == step else v for k, v in value.items()}
        return value

    # -- pseudonyms ------------------------------------------------------------------

    def session(self, value: str) -> str:
        """The pseudonym of a client-chosen id, ``<session:N>``."""
        known = self._sessions.get(value)
        if known is None:
            known = self._sessions[value] = f"<session:{len(self._sessions) + 1}>"
        return known

    def path(self, value: str) -> str:
        """The pseudonym of one path, ``<path:N>`` plus its basename's extension (PM42)."""
        key = value.rstrip("/\\") or value
        number = self._paths.get(key)
        if number is None:
            number = self._paths[key] = len(self._paths) + 1
        base = re.split(r"[/\\]", key)[-1]
        found = _EXTENSION.search(base)
        return f"<path:{number}>{found.group(0) if found else ''}"

    def _scrub(self, text: str) -> str:
        """``text`` with every path in it replaced by its pseudonym (under ``paths``)."""
        if not self.redaction.paths or ("/" not in text and "\\" not in text):
            return text  # every path has a separator: most strings are done here
        done = self._scrubbed.get(text)
        if done is None:
            if len(self._scrubbed) >= _MEMO_LIMIT:
                self._scrubbed.clear()  # the pseudonyms stay: the answers cannot change
            done = self._scrubbed[text] = _TOKEN.sub(self._replace, text)
        return done

    def _replace(self, match: re.Match[str]) -> str:
        token = match.group(0)
        if match.group("url") is not None:
            scheme, _, rest = token.partition("://")
            if _LOOPBACK_WEB.match(token) is not None:
                return token  # an engine's own address on this machine names nobody
            return f"{scheme}://{self._replace_path(rest)}" if rest.strip("/") else token
        if match.group("rel") is not None and not _is_relative_path(token):
            return token
        return self._replace_path(token)

    def _replace_path(self, token: str) -> str:
        stripped = token.rstrip(_TRAILING)
        if not stripped.strip("/\\.~"):
            return token
        found = _LINE_NUMBER.search(stripped)  # file.c:123 names file.c at a line
        if found is not None and found.start() > 0:
            stripped = stripped[: found.start()]
        return self.path(stripped) + token[len(stripped) :]


def _is_relative_path(token: str) -> bool:
    """Whether a ``a/b`` token in prose is a path: not a stream id, not ``tokens/s``."""
    parts = [part for part in token.split("/") if part]
    if len(parts) < 2 or parts[0] in _STREAM_FAMILIES or not _LETTER.search(token):
        return False
    return len(parts) >= 3 or _EXTENSION.search(parts[-1]) is not None
