"""Which discovered model files are offered, and under which ids (pure: no I/O, no clock).

The walk (:mod:`hostler.drivers.model_walk`) finds candidate files where users keep models;
:func:`plan_offer` decides, from those observations alone, what ``hostler serve`` offers:

- MD1 ids: a readable id per model, made from where it was found: the file name in the models
  folder and the config's folders (``smollm2-135m-instruct-f16``), ``hf-ORG-FILE`` in the
  Hugging Face cache, ``ollama-NAME-TAG`` (``ollama-NS-NAME-TAG`` outside ``library``) in
  Ollama's store, ``lms-PUBLISHER-FILE`` in LM Studio's folder; lower case, any run of other
  characters than ``a-z 0-9 . _ -`` as one ``-``, at most 100 characters (a longer one is cut
  and ends in a short hash of the whole). Never ``:`` (the middle of an engine key) nor ``/``.
- MD2 stability: a file offered before (``previous``: path → id, the last recorded offer)
  keeps its id; new files take ids in (source, path) order; a name already taken (by a
  configured model or another file) gets ``-2``, ``-3``... So an id never moves to another
  file while its file stays, across rescans and restarts.
- MD3 split GGUFs (``NAME-00001-of-00003.gguf``): the first part is the model (id ``NAME``,
  size of every part), and only when every part is in the same folder; an incomplete set is
  refused by name, its missing parts listed; later parts are never models of their own.
- MD4 projectors (``mmproj*.gguf``): not a model; refused, said so.
- MD5 bound: at most ``limit`` models are offered; the rest are refused, said so.
- MD7 settling: a file written less than ``settle`` seconds before ``now`` is being copied
  or downloaded: not offered yet (the next rescan offers it).

Removed files (MD6) are the driver's: :func:`offer_changes` says what was added and removed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "MAX_ID",
    "MAX_OFFERED",
    "SOURCES",
    "Candidate",
    "Offer",
    "Offered",
    "Refusal",
    "Source",
    "model_id",
    "offer_changes",
    "plan_offer",
    "replay_offer",
    "split_part",
]

#: Where a model can come from: the data directory's models folder, the Hugging Face hub
#: cache, Ollama's store, LM Studio's models folder, a folder the config names.
Source = Literal["models", "huggingface", "ollama", "lmstudio", "config"]
SOURCES: tuple[Source, ...] = ("models", "huggingface", "ollama", "lmstudio", "config")
#: MD5: the most discovered models offered at once.
MAX_OFFERED = 256
#: The longest model id (a config's ``[[models]] id`` has the same bound).
MAX_ID = 100

_OTHER = re.compile(r"[^a-z0-9._-]+")
_SPLIT = re.compile(r"^(?P<base>.+)-(?P<part>\d{5})-of-(?P<total>\d{5})$")


@dataclass(frozen=True, slots=True)
class Candidate:
    """A model file the walk found (an observation).

    Attributes:
        source: Where it was found.
        path: The file (absolute; for Ollama, the model layer's blob).
        label: The readable name its id is made from, before :func:`model_id`
            (``hf-bartowski-SmolLM2-Q4_K_M``); a split part's keeps its ``-0000N-of-0000M``.
        size: Its size in bytes.
        modified: When it was last written (epoch seconds, its ``st_mtime``).
    """

    source: Source
    path: str
    label: str
    size: int
    modified: float = 0.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """A file or folder that is not offered, and why (one line)."""

    path: str
    reason: str


@dataclass(frozen=True, slots=True)
class Offered:
    """A model offered under ``id``: its file (a split set's first part), source and size."""

    id: str
    path: str
    source: Source
    size: int


@dataclass(frozen=True, slots=True)
class Offer:
    """What :func:`plan_offer` decided: the models offered (by id order) and the refusals."""

    offered: tuple[Offered, ...]
    refused: tuple[Refusal, ...]

    def by_path(self) -> dict[str, str]:
        """Each offered file's id (what the next plan keeps, MD2)."""
        return {model.path: model.id for model in self.offered}


def model_id(label: str) -> str:
    """MD1: ``label`` as a model id (lower case, ``a-z0-9._-``, at most :data:`MAX_ID`)."""
    text = _OTHER.sub("-", label.lower()).strip("-._") or "model"
    if len(text) <= MAX_ID:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[: MAX_ID - 9].rstrip('-._')}-{digest}"


def split_part(name: str) -> tuple[str, int, int] | None:
    """``(base, part, total)`` of a split GGUF's file name (``x-00002-of-00003.gguf``), or None."""
    stem = name[:-5] if name.lower().endswith(".gguf") else name
    match = _SPLIT.match(stem)
    if match is None:
        return None
    return match["base"], int(match["part"]), int(match["total"])


def _file_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def _strip_split(label: str) -> str:
    parsed = split_part(label)
    return parsed[0] if parsed is not None else label


def _whole(
    candidates: Sequence[Candidate], now: float, settle: float
) -> tuple[list[Candidate], list[Refusal]]:
    """MD3, MD4, MD7: the candidates that are models (a split set as its first part, whole)."""
    models: list[Candidate] = []
    refused: list[Refusal] = []
    sets: dict[tuple[str, str, int], dict[int, Candidate]] = {}
    for found in candidates:
        name = _file_name(found.path)
        if settle > 0 and now - found.modified < settle:
            refused.append(
                Refusal(found.path, "being written (changed just now): offered once it settles")
            )
            continue
        if "mmproj" in name.lower():
            refused.append(
                Refusal(found.path, "a multimodal projector (mmproj), not a model: not offered")
            )
            continue
        parsed = split_part(name)
        if parsed is None:
            models.append(found)
            continue
        base, part, total = parsed
        if not 1 <= part <= total:
            refused.append(Refusal(found.path, f"split part {part} of {total}: not a valid part"))
            continue
        sets.setdefault((_folder(found.path), base, total), {})[part] = found
    for (_folder_name, base, total), parts in sorted(sets.items()):
        missing = [n for n in range(1, total + 1) if n not in parts]
        first = parts.get(1)
        if missing:
            shown = ", ".join(str(n) for n in missing[:10]) + (" ..." if len(missing) > 10 else "")
            where = (first or next(iter(parts.values()))).path
            refused.append(
                Refusal(where, f"split GGUF {base!r}: incomplete set, missing part(s) {shown}")
            )
            continue
        assert first is not None  # noqa: S101 - part 1 is not missing
        size = sum(p.size for p in parts.values())
        models.append(Candidate(first.source, first.path, first.label, size, first.modified))
    return models, refused


def plan_offer(
    candidates: Iterable[Candidate],
    *,
    previous: Mapping[str, str],
    taken: Collection[str] = (),
    limit: int = MAX_OFFERED,
    now: float = 0.0,
    settle: float = 0.0,
) -> Offer:
    """MD1–MD5: the models offered from ``candidates``, and what is refused and why.

    Args:
        candidates: What the walk found (in any order; the plan sorts them).
        previous: The last offer, file path → id (MD2: those files keep their ids).
        taken: Ids that are not discovery's to give (the config's own models).
        limit: The most models offered (MD5).
        now: The time of the walk (epoch seconds).
        settle: MD7: a file written within this many seconds of ``now`` is not offered yet.
    """
    order = {source: n for n, source in enumerate(SOURCES)}
    found = sorted(candidates, key=lambda c: (order[c.source], c.path))
    unique: list[Candidate] = []
    seen: set[str] = set()
    for candidate in found:  # one file reached twice (two sources, a link) is one model
        if candidate.path not in seen:
            seen.add(candidate.path)
            unique.append(candidate)
    models, refused = _whole(unique, now, settle)
    models.sort(key=lambda c: (order[c.source], c.path))
    reserved = set(taken)
    used: set[str] = set()
    ids: dict[str, str] = {}
    for model in models:  # MD2: an id offered before stays with its file
        kept = previous.get(model.path)
        if kept is not None and kept not in reserved and kept not in used:
            ids[model.path] = kept
            used.add(kept)
    offered: list[Offered] = []
    for model in models:
        name = ids.get(model.path)
        if name is None:
            name = _free(model_id(_strip_split(model.label)), reserved | used)
            used.add(name)
        if len(offered) >= limit:
            refused.append(Refusal(model.path, f"over the {limit} models discovery offers"))
            continue
        offered.append(Offered(name, model.path, model.source, model.size))
    offered.sort(key=lambda m: m.id)
    return Offer(tuple(offered), tuple(refused))


def _free(wanted: str, used: Collection[str]) -> str:
    """``wanted``, else ``wanted-2``, ``wanted-3``... (still at most :data:`MAX_ID`)."""
    if wanted not in used:
        return wanted
    n = 2
    while True:
        suffix = f"-{n}"
        name = wanted[: MAX_ID - len(suffix)] + suffix
        if name not in used:
            return name
        n += 1


def offer_changes(
    before: Sequence[Offered], after: Sequence[Offered]
) -> tuple[list[Offered], list[Offered]]:
    """MD6: the models ``after`` adds and the ones it no longer offers (a changed file is both).

    A model whose id, file or size changed is removed and added again.
    """
    old, new = set(before), set(after)
    added = sorted(new - old, key=lambda m: m.id)
    removed = sorted(old - new, key=lambda m: m.id)
    return added, removed


def replay_offer(
    changes: Iterable[tuple[Sequence[object], Sequence[object]]],
) -> tuple[Offered, ...]:
    """The offer the recorded changes leave, each ``(added, removed)`` applied in order.

    An entry that is not a well-formed model (a damaged or hand-edited row) is passed over:
    the next walk's plan simply offers what it finds.
    """
    current: dict[str, Offered] = {}
    for added, removed in changes:
        for gone in map(_recorded, removed):
            if gone is not None and current.get(gone.id) == gone:
                del current[gone.id]
        for model in map(_recorded, added):
            if model is not None:
                current[model.id] = model
    return tuple(sorted(current.values(), key=lambda m: m.id))


def _recorded(entry: object) -> Offered | None:
    """A recorded model (``{"id", "path", "source", "size"}``), or None when malformed."""
    if not isinstance(entry, Mapping):
        return None
    name, path, source, size = (entry.get(k) for k in ("id", "path", "source", "size"))
    if not (isinstance(name, str) and isinstance(path, str) and source in SOURCES):
        return None
    if type(size) is not int or size < 0:
        return None
    return Offered(name, path, source, size)
