"""The walk for model files where users keep them (blocking: run it off the event loop).

Each place is read as its owner lays it out:

- the models folder and the config's folders: every ``*.gguf`` below them, at any depth;
- the Hugging Face hub cache (``HUB/models--ORG--NAME/snapshots/REV/**.gguf``): the revision
  ``refs/main`` names, else the newest snapshot;
- Ollama's store (``manifests/REGISTRY/NS/NAME/TAG``, a JSON manifest): the layer of media type
  ``application/vnd.ollama.image.model``, whose file is ``blobs/sha256-HEX``;
- LM Studio's models folder (``PUBLISHER/REPO/*.gguf``).

Folders are untrusted: they may be huge, unreadable, full of links or hostile. The walk is
bounded (:data:`MAX_ENTRIES` entries looked at per place, :data:`MAX_DEPTH` folders deep,
manifests of at most :data:`MAX_MANIFEST` bytes), enters each folder once (a link loop is
seen, not followed), never opens what is not a regular file, reads 4 bytes of each model (a
file that is not GGUF is refused) and turns every bad entry into a :class:`Refusal` with one
line of reason: it never raises for what it finds. What is offered is decided by
:func:`hostler.policies.offer.plan_offer`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hostler.events.discovery import MODELS_STREAM, ModelsOffered
from hostler.policies.offer import (
    MAX_OFFERED,
    Candidate,
    Offer,
    Offered,
    Refusal,
    Source,
    plan_offer,
    replay_offer,
)
from hostler.store.log import EventStore
from hostler.untrusted import parse_json

__all__ = [
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_MANIFEST",
    "Surveyed",
    "Walked",
    "recorded_offer",
    "survey",
    "walk_places",
]

#: Directory entries looked at per place (a folder of 100k files is cut there, said so).
MAX_ENTRIES = 20_000
#: Folders below a place the walk enters (``models--x/snapshots/rev/sub/file`` is 4).
MAX_DEPTH = 8
#: The largest Ollama manifest read (theirs are a few hundred bytes).
MAX_MANIFEST = 1024 * 1024
#: The most refusals kept per walk (the rest are counted).
MAX_REFUSALS = 100
#: Ollama's layer of model weights.
OLLAMA_MODEL = "application/vnd.ollama.image.model"
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_OLLAMA_HOME = ("registry.ollama.ai", "library")
_GGUF = b"GGUF"


@dataclass(slots=True)
class Walked:
    """What one walk found: candidate models, refusals (at most :data:`MAX_REFUSALS`)."""

    candidates: list[Candidate] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    more_refused: int = 0
    #: The places whose walk was cut short (over their entries): what is there was not all seen.
    cut: list[tuple[Source, Path]] = field(default_factory=list)

    def refuse(self, path: Path | str, reason: str) -> None:
        """Keep a refusal (past :data:`MAX_REFUSALS`, count it)."""
        if len(self.refused) < MAX_REFUSALS:
            self.refused.append(Refusal(str(path), reason))
        else:
            self.more_refused += 1


@dataclass(slots=True)
class _Walk:
    """One place's walk: its budget of entries and the folders (and files) already seen."""

    out: Walked
    max_entries: int
    max_depth: int
    entries: int = 0
    cut: bool = False
    seen_dirs: set[tuple[int, int]] = field(default_factory=set)
    seen_files: dict[tuple[int, int], str] = field(default_factory=dict)  # file -> its label

    def files(
        self, root: Path, *, depth: int = 0, suffix: str = ".gguf", max_depth: int | None = None
    ) -> Iterator[tuple[Path, os.stat_result]]:
        """Every regular file below ``root`` whose name ends in ``suffix``, stat'ed.

        Links are followed, each folder entered once; ``depth`` is how deep ``root`` itself
        is; ``max_depth`` (default: the walk's) how deep it goes.
        """
        deepest = self.max_depth if max_depth is None else max_depth
        stack = [(root, depth)]
        while stack:
            folder, level = stack.pop()
            try:
                found = folder.stat()
                if (found.st_dev, found.st_ino) in self.seen_dirs:
                    continue  # a link loop, or a folder reached twice
                self.seen_dirs.add((found.st_dev, found.st_ino))
                listing = os.scandir(folder)
            except OSError as exc:
                self.out.refuse(folder, f"cannot be read ({_why(exc)})")
                continue
            folders: list[tuple[Path, int]] = []
            with listing:  # read as it comes: a folder of 100k names is never held whole
                try:
                    for entry in listing:
                        if not self.count(folder):
                            return
                        if entry.name.startswith("."):
                            continue  # hidden: partial downloads, caches
                        wanted = self._entry(Path(entry.path), suffix, level, deepest, folders)
                        if wanted is not None:
                            yield wanted
                except OSError as exc:
                    self.out.refuse(folder, f"cannot be read to its end ({_why(exc)})")
            stack.extend(sorted(folders, reverse=True))

    def count(self, folder: Path) -> bool:
        """One more entry looked at; False (said once) past the walk's budget."""
        self.entries += 1
        if self.entries <= self.max_entries:
            return True
        if not self.cut:
            self.cut = True
            self.out.refuse(
                folder,
                f"over {self.max_entries} entries looked at: the rest of this place is not "
                "searched",
            )
        return False

    def _entry(
        self, path: Path, suffix: str, level: int, deepest: int, folders: list[tuple[Path, int]]
    ) -> tuple[Path, os.stat_result] | None:
        """A wanted file (stat'ed), or None: a folder to enter is added to ``folders``."""
        try:
            target = path.stat()  # links followed
        except OSError as exc:
            if path.name.lower().endswith(suffix):
                self.out.refuse(path, f"cannot be read ({_why(exc)})")
            return None
        if stat.S_ISDIR(target.st_mode):
            if level + 1 > deepest:
                self.out.refuse(path, f"over {deepest} folders deep: not searched")
            else:
                folders.append((path, level + 1))
        elif path.name.lower().endswith(suffix):
            if stat.S_ISREG(target.st_mode):
                return path, target
            self.out.refuse(path, "not a regular file")
        return None

    def model(self, source: Source, path: Path, found: os.stat_result, label: str) -> None:
        """``path`` as a candidate when it is a GGUF not seen before, else refused."""
        identity = (found.st_dev, found.st_ino)
        first = self.seen_files.get(identity)
        if first is not None:  # a second link (or Ollama tag) to a file already found here
            self.out.refuse(path, f"{label}: the same file as {first}, offered once as that")
            return
        self.seen_files[identity] = label
        problem = _not_gguf(path)
        if problem is not None:
            self.out.refuse(path, problem)
            return
        self.out.candidates.append(
            Candidate(source, str(path), label, found.st_size, found.st_mtime)
        )


def walk_places(
    places: Sequence[tuple[Source, Path]],
    *,
    max_entries: int = MAX_ENTRIES,
    max_depth: int = MAX_DEPTH,
) -> Walked:
    """Every candidate model in ``places`` (source, folder), read as each source lays it out.

    A place that does not exist is skipped quietly (nobody installed that program), but for a
    folder the config names (said so); one that
    cannot be read is refused with its reason.
    """
    out = Walked()
    for source, root in places:
        if not root.is_dir():
            if source == "config":  # named on purpose: say why nothing comes of it
                what = "is not a folder" if root.exists() else "does not exist"
                out.refuse(root, f"a [discovery] folder that {what}")
            continue
        walk = _Walk(out, max_entries, max_depth)
        if source == "huggingface":
            _hugging_face(walk, root)
        elif source == "ollama":
            _ollama(walk, root)
        elif source == "lmstudio":
            for path, found in walk.files(root):
                publisher = path.relative_to(root).parts[0]
                walk.model(source, path, found, f"lms-{publisher}-{path.stem}")
        else:
            for path, found in walk.files(root):
                walk.model(source, path, found, path.stem)
        if walk.cut:
            out.cut.append((source, root))
    return out


@dataclass(frozen=True, slots=True)
class Surveyed:
    """A walk and its plan: the models offered, and every refusal (the plan's, then the walk's).

    ``more_refused`` counts the walk's refusals past those it kept.
    """

    offer: Offer
    refused: tuple[Refusal, ...]
    more_refused: int


def survey(
    places: Sequence[tuple[Source, Path]],
    *,
    before: Sequence[Offered],
    taken: Collection[str],
    now: float,
    settle: float,
    limit: int = MAX_OFFERED,
    max_entries: int = MAX_ENTRIES,
) -> Surveyed:
    """Walk ``places`` and decide the offer (:func:`~hostler.policies.offer.plan_offer`).

    The one way the daemon's catalog and ``hostler doctor`` find models: what the doctor says
    is offered is what ``hostler serve`` offers. ``before`` is the last offer: its files keep
    their ids (MD2), and one in a place whose walk was cut short (over ``max_entries``) stays
    offered as it was: not seen is not gone. Blocking: run it off the event loop.
    """
    walked = walk_places(places, max_entries=max_entries)
    seen = {candidate.path for candidate in walked.candidates}
    unreached = [
        Candidate(model.source, model.path, model.id, model.size, 0.0)
        for model in before
        if model.path not in seen
        and any(
            source == model.source and Path(model.path).is_relative_to(root)
            for source, root in walked.cut
        )
        and Path(model.path).is_file()  # one stat each (at most MAX_OFFERED): gone is gone
    ]
    offer = plan_offer(
        [*walked.candidates, *unreached],
        previous={model.path: model.id for model in before},
        taken=taken,
        limit=limit,
        now=now,
        settle=settle,
    )
    return Surveyed(offer, (*offer.refused, *walked.refused), walked.more_refused)


def recorded_offer(store: EventStore) -> tuple[Offered, ...]:
    """The offer the log's ``models.offered`` records leave (what a restart keeps ids from).

    Read by the daemon's catalog when it opens, and by ``hostler doctor``: both then give a
    file the id the daemon gave it. Blocking: run it off the event loop.
    """
    return replay_offer(
        (record.event.added, record.event.removed)
        for record in store.read_all(streams=[MODELS_STREAM], types=[ModelsOffered.TYPE])
        if isinstance(record.event, ModelsOffered)
    )


def _hugging_face(walk: _Walk, hub: Path) -> None:
    """``models--ORG--NAME/snapshots/REV/**.gguf``, of the revision ``refs/main`` names."""
    repos: list[str] = []
    try:
        with os.scandir(hub) as listing:
            for entry in listing:
                if not walk.count(hub):
                    break
                if entry.name.startswith("models--"):
                    repos.append(entry.name)
    except OSError as exc:
        walk.out.refuse(hub, f"cannot be read ({_why(exc)})")
        return
    for name in sorted(repos):
        parts = name.split("--")
        org = parts[1] if len(parts) > 2 else ""
        snapshot = _snapshot(walk, hub / name)
        if snapshot is None:
            continue
        for path, found in walk.files(snapshot, depth=3):
            walk.model("huggingface", path, found, f"hf-{org}-{path.stem}")


def _snapshot(walk: _Walk, repo: Path) -> Path | None:
    """The revision of a hub repo to offer: ``refs/main``'s, else the newest snapshot."""
    snapshots = repo / "snapshots"
    try:
        ref = (repo / "refs" / "main").read_text(encoding="ascii").strip()[:64]
    except (OSError, UnicodeDecodeError):
        ref = ""
    if ref and re.fullmatch(r"[0-9a-f]{6,64}", ref) and (snapshots / ref).is_dir():
        return snapshots / ref
    revisions: list[tuple[float, str]] = []
    try:
        with os.scandir(snapshots) as listing:
            for entry in listing:
                if not walk.count(snapshots):
                    break
                if entry.is_dir():
                    revisions.append((entry.stat().st_mtime, entry.name))
    except OSError:
        return None
    return snapshots / max(revisions)[1] if revisions else None


def _ollama(walk: _Walk, store: Path) -> None:
    """Each manifest's model layer (``blobs/sha256-HEX``), named after the manifest."""
    manifests = store / "manifests"
    if not manifests.is_dir():
        return
    for manifest, found in walk.files(manifests, suffix="", max_depth=4):
        parts = manifest.relative_to(manifests).parts
        if len(parts) != 4:
            walk.out.refuse(manifest, "not where Ollama keeps a manifest (REGISTRY/NS/NAME/TAG)")
            continue
        registry, namespace, name, tag = parts
        problem, digest = _model_layer(manifest, found)
        if digest is None:
            walk.out.refuse(manifest, f"an Ollama manifest hostler cannot use: {problem}")
            continue
        blob = store / "blobs" / f"sha256-{digest}"
        try:
            target = blob.stat()
        except OSError as exc:
            walk.out.refuse(manifest, f"its model blob {blob.name} cannot be read ({_why(exc)})")
            continue
        if not stat.S_ISREG(target.st_mode):
            walk.out.refuse(blob, "not a regular file")
            continue
        named = (
            f"{name}-{tag}"
            if (registry, namespace) == _OLLAMA_HOME
            else f"{namespace}-{name}-{tag}"
        )
        walk.model("ollama", blob, target, f"ollama-{named}")


def _model_layer(manifest: Path, found: os.stat_result) -> tuple[str, str | None]:
    """The digest (hex) of a manifest's model layer, or why there is none."""
    if found.st_size > MAX_MANIFEST:
        return f"over {MAX_MANIFEST // 1024} KiB", None
    try:
        with manifest.open("rb") as file:
            document = parse_json(file.read(MAX_MANIFEST + 1))
    except OSError as exc:
        return f"cannot be read ({_why(exc)})", None
    except ValueError:
        return "not JSON", None
    layers = document.get("layers") if isinstance(document, dict) else None
    model = next(
        (
            layer
            for layer in (layers if isinstance(layers, list) else [])[:1000]
            if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL
        ),
        None,
    )
    if model is None:
        return f"no layer of media type {OLLAMA_MODEL}", None
    digest = model.get("digest")
    match = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if match is None:
        return "its model layer's digest is not sha256:<64 hex digits>", None
    return "", match[1]


def _not_gguf(path: Path) -> str | None:
    """Why ``path`` (a regular file) is not a GGUF model file, or None."""
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as exc:
        return f"cannot be read ({_why(exc)})"
    if magic != _GGUF:
        return "not a GGUF file (it does not start with 'GGUF')"
    return None


def _why(exc: OSError) -> str:
    """An OS error in a few words (``permission denied``), never a traceback."""
    return (exc.strerror or type(exc).__name__).lower()
