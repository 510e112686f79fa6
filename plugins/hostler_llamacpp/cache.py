"""The llama.cpp prompt-cache adapter (L16): sessions bound to slots, slots saved to disk.

``llama-server --parallel N`` keeps one KV cache per slot. Each session is bound to a slot of
the launched engine (``id_slot`` and ``cache_prompt`` in its requests), so its next turn finds
its prompt still cached. With more sessions than slots, the least recently used slot is
recycled: its session's KV is first saved to ``sess-<id>.bin`` in the engine's
``--slot-save-path`` directory, and a session coming back is restored from its file
(``POST /slots/{id}?action=save|restore|erase``). A server that answers 501 to a slot action
(started without ``--slot-save-path``, or with a projector) has none: the adapter stops asking
for the rest of the process's life and says so once. Usage comes from ``GET /slots``.

Every HTTP call is made with ``urllib`` in a worker thread and is best effort: a failure is
logged and answered as "not done".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from hostler.plugin import (
    CacheEntry,
    SessionPrepared,
    SessionSaved,
    entry_bytes,
    parse_json,
)

__all__ = [
    "SLOTS_FILE",
    "VERSION_FILE",
    "LlamaCacheAdapter",
    "model_stamp",
    "retire_other_versions",
    "session_filename",
]

log = logging.getLogger(__name__)

#: Seconds one slot action or ``/slots`` read may take.
HTTP_TIMEOUT = 30.0
#: After the engine did not answer a usage poll: the first pause before it is polled again
#: (seconds), doubled after each miss up to :data:`POLL_BACKOFF_MAX`; an answer resets it.
POLL_BACKOFF = 5.0
POLL_BACKOFF_MAX = 300.0
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def session_filename(session_id: str) -> str:
    """``sess-<id>.bin``; any other id is hashed: ``sess-<sha256>.h.bin``.

    The hashed names end in ``.h.bin``, a shape no plain id makes (a plain id has no dot), so
    a client can never name another session's file by sending its hash as its own id. Any
    string is accepted (a lone surrogate included: it is hashed as its code points).
    """
    if _SAFE_ID.match(session_id):
        return f"sess-{session_id}.bin"
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sess-{digest[:40]}.h.bin"


#: A save is written under this suffix, then renamed over the session's file once its size is
#: what the engine said it wrote: a full disk or a crash mid-save never leaves a cut-short file
#: where a restore would read it (llama.cpp aborts on one), and the previous file stays.
PARTIAL = ".part"


#: The file in a save directory that names the version its session files were made by.
VERSION_FILE = "sessions.version"
#: The file in a save directory that tells which session each slot of the running engine
#: holds, so that a daemon that adopts the engine keeps every session on its slot.
SLOTS_FILE = "slots.json"


def model_stamp(model: Path | None) -> str:
    """The model file's size, modification time and a digest of samples of its content.

    The last part of a version: a replaced or re-downloaded model file is another version, even
    one of the same size whose modification time was put back (``cp -p``, ``rsync -a``,
    ``touch -r``): 16 samples of 64 KiB spread over the file are hashed (1 MiB read, whatever
    the model's size). A hard link, a rename or a ``chmod`` changes none of it. ("" for none.)
    Reads the file: make it where that may wait (off the event loop).
    """
    if model is None:
        return ""
    try:
        facts = model.stat()
        digest = _sampled_digest(model, facts.st_size)
    except OSError:
        return "|model-unreadable"
    return f"|size={facts.st_size}|mtime={facts.st_mtime_ns}|sample={digest}"


_SAMPLES, _SAMPLE = 16, 64 * 1024


def _sampled_digest(model: Path, size: int) -> str:
    """A digest of ``_SAMPLES`` chunks of ``_SAMPLE`` bytes evenly spread over the file."""
    hasher = hashlib.sha256()
    with model.open("rb") as handle:
        for index in range(_SAMPLES):
            handle.seek(size * index // _SAMPLES)
            hasher.update(handle.read(_SAMPLE))
    return hasher.hexdigest()[:16]


def retire_other_versions(folder: Path, version: str) -> int:
    """Delete the session files in ``folder`` made by another version; how many went.

    The version is written beside the files, so the next launch of the same model finds its
    own. A folder that cannot be read or written is left as it is (its files are then
    restored only if llama-server accepts them).
    """
    marker = folder / VERSION_FILE
    try:
        if marker.read_text(encoding="utf-8") == version:
            return 0
    except (OSError, UnicodeDecodeError):
        pass
    gone = 0
    try:
        for path in [*folder.glob("sess-*.bin"), *folder.glob(f"sess-*.bin{PARTIAL}")]:
            with contextlib.suppress(OSError):
                path.unlink()
                gone += 1
        marker.write_text(version, encoding="utf-8")
    except OSError as error:
        log.info("could not retire old session files in %s: %s", folder, error)
    if gone:
        log.info("deleted %d session file(s) of another model version in %s", gone, folder)
    return gone


def _http(url: str, method: str, body: bytes | None, timeout: float) -> tuple[int, Any]:
    """One request: the status and the decoded JSON body (None when it is not JSON)."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    request = urllib.request.Request(url, body, headers, method=method)  # noqa: S310 - loopback only
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback only
            status, raw = int(response.status), response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, parse_json(raw)
    except ValueError:  # not JSON, or nested past the decoder's depth
        return status, None


class LlamaCacheAdapter:
    """L16: the cache mechanism of one ``llama-server`` process.

    Args:
        port: The engine's loopback port.
        slots: The LAUNCHED slot count (``--parallel``), never a queue's concurrency.
        save_dir: The engine's ``--slot-save-path``; None: no saving (slots still bind).
        clock: Epoch seconds, for least-recently-used recycling and reports.
        timeout: Seconds one HTTP call may take.
        version: What the session files were made by (the model, its window, its KV type):
            files of another version in ``save_dir`` are deleted before the first is used, so
            a state saved by another model, context or KV type is never restored.
        model: The model file: its size and modification time, read here (the adapter is made
            off the event loop, when its launch is ready), are part of the version.
        recall: The engine was adopted from an earlier daemon: the slot table it left beside
            the files (same port, same version, slots the engine says it uses) puts each
            session back on its own slot. Never for a launch made now (found by the benchmark:
            a new engine on a reused port, having served a one-shot, passed for the old one).
    """

    def __init__(
        self,
        port: int,
        slots: int,
        save_dir: Path | None,
        *,
        clock: Callable[[], float] = time.time,
        timeout: float = HTTP_TIMEOUT,
        version: str = "",
        model: Path | None = None,
        recall: bool = False,
    ) -> None:
        if slots < 1:
            raise ValueError(f"a llama-server has at least one slot, not {slots}")
        self._base = f"http://127.0.0.1:{port}"
        self._port = port
        # the slot table is read back only for an engine an earlier daemon started: a new
        # launch that got an earlier one's port holds none of its sessions
        self._recalled = save_dir is None or not recall
        self._save_dir = save_dir
        self._clock = clock
        self._timeout = timeout
        self._bound: list[str | None] = [None] * slots
        self._used: list[float] = [0.0] * slots
        self._tokens: list[int | None] = [None] * slots
        self._actions = save_dir is not None
        self._lock = anyio.Lock()
        # stamped now, as the launch is made: a file replaced under the running engine later
        # does not make the states this engine saves pass for the new file's
        self._version = version + model_stamp(model) if version else ""
        self._version_checked = save_dir is None or not version  # "": nothing to check
        self._misses = 0  # usage polls in a row the engine did not answer
        self._quiet_until = 0.0  # no usage poll before this (clock) time

    @property
    def slots(self) -> int:
        """How many slots the engine was launched with."""
        return len(self._bound)

    @property
    def version(self) -> str:
        """What its session files are made by: model, window, KV type, build, model file."""
        return self._version

    @property
    def slot_actions(self) -> bool:
        """Whether save/restore/erase are still tried (off without a save dir, or after a 501)."""
        return self._actions

    def slot_of(self, session_id: str) -> int | None:
        """The slot the session is bound to, if any."""
        try:
            return self._bound.index(session_id)
        except ValueError:
            return None

    def _bind(self, session_id: str) -> tuple[int, str | None, bool]:
        """Bind (slot, victim whose slot it took, whether it was bound already); no I/O."""
        now = self._clock()
        slot = self.slot_of(session_id)
        if slot is not None:
            self._used[slot] = now
            return slot, None, True
        free = [i for i, bound in enumerate(self._bound) if bound is None]
        slot = free[0] if free else min(range(self.slots), key=lambda i: (self._used[i], i))
        victim = self._bound[slot]
        self._bound[slot] = session_id
        self._used[slot] = now
        self._tokens[slot] = None
        return slot, victim, False

    def request_extras(self, session_id: str) -> dict[str, Any]:
        """``cache_prompt`` and the session's ``id_slot`` (binding it now if it has none).

        Binding here does no I/O, so a recycled slot's session is not saved: call
        :meth:`prepare` before the request for that.
        """
        slot, _, _ = self._bind(session_id)
        return {"cache_prompt": True, "id_slot": slot}

    async def prepare(self, session_id: str) -> SessionPrepared:
        """Bind the session to a slot before its request; where its prompt cache comes from.

        ``memory``: it was bound already. Otherwise a recycled slot's session is saved first
        (``displaced``), then the session's own file (if any) is restored: ``disk``; else
        ``fresh``. Allocations are serialized, so two sessions never race for one slot.
        """
        async with self._lock:
            await self._recall()
            slot, victim, bound = self._bind(session_id)
            fields = {"cache_prompt": True, "id_slot": slot}
            if bound:
                return SessionPrepared("memory", fields)
            await self._persist()
            displaced = None if victim is None else await self._save_slot(slot, victim)
            started = time.monotonic()
            restored, error = await self._restore(slot, session_id)
            took = round(time.monotonic() - started, 6)
            if restored is None:
                # the slot still holds whatever its last user left (a session, a one-shot):
                # erased, so a session never reads, nor learns the length of, another's prompt
                await self._slot_action(slot, "erase", None)
                return SessionPrepared("fresh", fields, displaced=displaced, error=error)
            self._tokens[slot] = restored
            return SessionPrepared("disk", fields, restored, took, displaced)

    def _table(self) -> dict[str, Any]:
        return {"version": self._version, "port": self._port, "bound": list(self._bound)}

    async def _persist(self) -> None:
        """The slot table, written beside the files (a daemon that adopts the engine reads it)."""
        if self._save_dir is None:
            return
        path, table = self._save_dir / SLOTS_FILE, json.dumps(self._table())

        def write() -> None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                partial_path = path.with_suffix(".json.new")
                partial_path.write_text(table, encoding="utf-8")
                partial_path.replace(path)
            except OSError as error:
                log.info("could not write %s: %s", path, error)

        await anyio.to_thread.run_sync(write)

    async def _recall(self) -> None:
        """Once: the slot table of the engine on this port, when it was made by this version.

        An engine adopted by a restarted daemon still holds its sessions in their slots; this
        puts each back on its own. Any other table (another port: another launch; another
        version; unreadable) is ignored, and the engine has the last word (CC8): a slot its
        ``GET /slots`` shows unused is not recalled (a new engine that got an earlier one's
        port), so its session is restored from its file instead.
        """
        if self._recalled or self._save_dir is None:
            return
        self._recalled = True
        path = self._save_dir / SLOTS_FILE

        def read() -> object:
            try:
                return parse_json(path.read_bytes()[:1_000_000])
            except (OSError, ValueError):
                return None

        table = await anyio.to_thread.run_sync(read)
        if not isinstance(table, dict) or table.get("port") != self._port:
            return
        bound = table.get("bound")
        if table.get("version") != self._version or not isinstance(bound, list):
            return
        if len(bound) != self.slots or not all(s is None or isinstance(s, str) for s in bound):
            return
        used = await self._used_slots()
        now = self._clock()
        self._bound = [s if i in used else None for i, s in enumerate(bound)]
        self._used = [now] * self.slots

    async def _used_slots(self) -> set[int]:
        """The slots the engine says hold a prompt (``GET /slots``); none when it cannot say."""
        told = await self._slot_tokens()
        return set() if told is None else {slot for slot, tokens in told.items() if tokens > 0}

    async def _slot_tokens(self) -> dict[int, int] | None:
        """Each slot's tokens as ``GET /slots`` tells them; None when it cannot tell.

        ``n_cache_tokens`` (older servers), else ``n_prompt_tokens``; a slot telling neither is
        left out.
        """
        reply = await self._request("GET", "/slots", None)
        if reply is None or reply[0] != 200 or not isinstance(reply[1], list):
            return None
        told: dict[int, int] = {}
        for item in reply[1]:
            if isinstance(item, dict) and isinstance(item.get("id"), int):
                tokens = item.get("n_cache_tokens", item.get("n_prompt_tokens"))
                if isinstance(tokens, int):
                    told[item["id"]] = tokens
        return told

    async def _check_version(self) -> None:
        """Before the first file is used: files of another version are deleted (once)."""
        if self._version_checked or self._save_dir is None:
            return
        self._version_checked = True
        await anyio.to_thread.run_sync(retire_other_versions, self._save_dir, self._version)

    async def _restore(self, slot: int, session_id: str) -> tuple[int | None, str]:
        """Tokens restored from the session's file, or None and why (no file: no reason)."""
        name = session_filename(session_id)
        if not self._actions or self._save_dir is None:
            return None, ""
        await self._check_version()
        if not await anyio.to_thread.run_sync((self._save_dir / name).is_file):
            return None, ""
        reply = await self._slot_action(slot, "restore", name)
        if reply is None:
            # a file the engine cannot restore never will be (a damaged or cut-short one may
            # even crash it): deleted, so the session's next turns are cold, not crashes
            if self._actions:
                await self.discard([session_id])
            return None, f"llama-server did not restore {name}; the file was deleted"
        restored = reply.get("n_restored")
        return (restored if isinstance(restored, int) else 0), ""

    async def save(self, session_id: str) -> bool:
        """Save the session's slot to its file (for a freeze or a shutdown); False if not done."""
        async with self._lock:
            slot = self.slot_of(session_id)
            if slot is None:
                return False
            return not (await self._save_slot(slot, session_id)).error

    async def _save_slot(self, slot: int, session_id: str) -> SessionSaved:
        """Save one slot to its session's file; what was written, or why nothing was."""
        name = session_filename(session_id)
        if not self._actions:
            return SessionSaved(session_id, error="this engine saves no slots")
        await self._check_version()
        started = time.monotonic()
        reply = await self._slot_action(slot, "save", name + PARTIAL)
        took = round(time.monotonic() - started, 6)
        written = None if reply is None else reply.get("n_written")
        size = await self._settle(name, written if isinstance(written, int) else None)
        if reply is None or size is None:
            why = "did not save" if reply is None else f"wrote a short or no file for {name}"
            return SessionSaved(
                session_id, seconds=took, error=f"llama-server {why}; the previous file is kept"
            )
        tokens = reply.get("n_saved")
        return SessionSaved(
            session_id,
            tokens if isinstance(tokens, int) and tokens >= 0 else 0,
            size,
            took,
            used_at=self._used[slot],
        )

    async def _settle(self, name: str, written: int | None) -> int | None:
        """The partial save made the session's file (its size), or deleted (None).

        It becomes the file only when it is there, not empty, and as long as the engine said
        it wrote (when it said): a full disk leaves a shorter one.
        """
        if self._save_dir is None:
            return None
        final = self._save_dir / name
        partial_path = final.with_name(name + PARTIAL)

        def settle() -> int | None:
            try:
                size = partial_path.stat().st_size
                if size > 0 and (written is None or size == written):
                    partial_path.replace(final)
                    return size
                partial_path.unlink()
            except OSError as error:
                log.info("could not settle %s: %s", partial_path, error)
                with contextlib.suppress(OSError):
                    partial_path.unlink()
            return None

        return await anyio.to_thread.run_sync(settle)

    def held_sessions(self) -> list[str]:
        """The sessions bound to a slot, most recently used first (saved first at a stop)."""
        bound = [(self._used[i], s) for i, s in enumerate(self._bound) if s is not None]
        return [session for _, session in sorted(bound, key=lambda b: -b[0])]

    async def save_session(self, session_id: str) -> SessionSaved:
        """Save the session's slot to its file; what was written, or why nothing was."""
        async with self._lock:
            slot = self.slot_of(session_id)
            if slot is None:
                return SessionSaved(session_id, error="not held by this engine")
            return await self._save_slot(slot, session_id)

    async def saved_sizes(self, session_ids: Sequence[str]) -> dict[str, int]:
        """CC14: the sessions among ``session_ids`` with a file this engine can restore.

        Files of another version (model file, window, KV type, engine build) are deleted
        first; each answer is the file's size on disk.
        """
        if self._save_dir is None:
            return {}
        await self._check_version()
        folder = self._save_dir

        def sizes() -> dict[str, int]:
            found: dict[str, int] = {}
            for session_id in session_ids:
                try:
                    facts = (folder / session_filename(session_id)).stat()
                except OSError:
                    continue
                found[session_id] = facts.st_size
            return found

        return await anyio.to_thread.run_sync(sizes)

    async def discard(self, session_ids: Sequence[str]) -> None:
        """CC14: delete the sessions' files (their engine may be gone: nothing is asked of it)."""
        if self._save_dir is None:
            return
        folder = self._save_dir

        def delete() -> None:
            for session_id in session_ids:
                path = folder / session_filename(session_id)
                try:
                    path.unlink(missing_ok=True)
                except OSError as error:
                    log.info("could not delete %s: %s", path, error)

        await anyio.to_thread.run_sync(delete)

    async def save_all(self) -> list[SessionSaved]:
        """Save every bound slot to its session's file, most recently used first."""
        return [await self.save_session(session) for session in self.held_sessions()]

    async def flush(self) -> int:
        """Save every bound slot to its session's file; how many were saved."""
        return sum(1 for saved in await self.save_all() if not saved.error)

    async def evict(self, ids: Sequence[str]) -> None:
        """Erase the sessions' slots and delete their files (a later turn starts fresh).

        Serialized with :meth:`prepare`, so a slot is never erased while it is being bound.
        """
        async with self._lock:
            for session_id in ids:
                slot = self.slot_of(session_id)
                if slot is not None:
                    self._bound[slot] = None
                    self._tokens[slot] = None
                    await self._slot_action(slot, "erase", None)
            await self._persist()
            await self.discard(ids)

    async def report_usage(self) -> list[CacheEntry] | None:
        """The bound sessions' caches as ``GET /slots`` tells them; None if it cannot.

        A slot's tokens are its ``n_cache_tokens`` (older servers), else ``n_prompt_tokens``,
        else what its last restore brought back; a slot that tells nothing is left out. An
        engine that did not answer (stopped, hung) is not polled again for a while: 5 s after
        the first miss, doubling to 5 min, until it answers; only the first miss is logged at
        INFO, the rest at DEBUG.
        """
        if self._clock() < self._quiet_until:
            return None  # it did not answer lately: not asked again before its pause ends
        told = await self._slot_tokens()
        if told is None:
            return None
        entries = []
        for slot, session_id in enumerate(self._bound):
            tokens = told.get(slot) or self._tokens[slot]
            if session_id is None or tokens is None:
                continue
            entries.append(
                CacheEntry(session_id, tokens, entry_bytes(tokens), last_used_at=self._used[slot])
            )
        return entries

    async def _slot_action(
        self, slot: int, action: str, filename: str | None
    ) -> dict[str, Any] | None:
        """One slot action; its JSON reply when it succeeded, else None (501 latches off)."""
        if not self._actions:
            return None
        body = None if filename is None else json.dumps({"filename": filename}).encode()
        reply = await self._request("POST", f"/slots/{slot}?action={action}", body)
        if reply is None:
            return None
        status, data = reply
        if status == 501:
            if self._actions:
                self._actions = False
                log.warning(
                    "llama-server on %s has no slot save/restore (HTTP 501 to %s): prompt "
                    "caches stay in memory only for this process",
                    self._base,
                    action,
                )
            return None
        if not 200 <= status < 300:
            log.info("llama-server slot %d %s answered %d: %s", slot, action, status, data)
            return None
        return data if isinstance(data, dict) else {}

    async def _request(self, method: str, path: str, body: bytes | None) -> tuple[int, Any] | None:
        """The status and JSON of one call, or None when the engine did not answer."""
        call = partial(_http, self._base + path, method, body, self._timeout)
        try:
            answer = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        except (OSError, ValueError) as error:
            self._missed(f"llama-server {method} {path} failed: {error}")
            return None
        self._misses, self._quiet_until = 0, 0.0
        return answer

    def _missed(self, what: str) -> None:
        """The engine did not answer: pause the usage polls, longer after each miss in a row."""
        self._misses += 1
        pause = min(POLL_BACKOFF * 2 ** min(self._misses - 1, 16), POLL_BACKOFF_MAX)
        self._quiet_until = self._clock() + pause
        if self._misses == 1:
            log.info("%s (usage polls paused, longer after each miss, until it answers)", what)
        else:
            log.debug("%s (miss %d in a row; next poll in %.0f s)", what, self._misses, pause)
