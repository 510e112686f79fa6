"""Model discovery: the pure plan (MD1–MD7), the bounded walk on real folder layouts, the catalog.

Every folder here is a real one in a temporary directory, shaped as its owner lays it out
(the Hugging Face hub cache with its blob links, an Ollama store with a real manifest, LM
Studio's folder); no test reads the real user's home.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import anyio
import pytest

from hostler import EventStore
from hostler.clock import SYSTEM_CLOCK
from hostler.config import DaemonConfig, DiscoverySettings, EngineConfig
from hostler.daemon_parts.catalog import Catalog
from hostler.drivers.model_walk import OLLAMA_MODEL, survey, walk_places
from hostler.drivers.offloop import OffLoop
from hostler.events.discovery import MODELS_STREAM
from hostler.policies.offer import (
    Candidate,
    Offered,
    Source,
    model_id,
    offer_changes,
    plan_offer,
    replay_offer,
    split_part,
)

GGUF = b"GGUF" + bytes(60)
OLD = time.time() - 3600  # written an hour ago: settled


def gguf(path: Path, data: bytes = GGUF) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (OLD, OLD))
    return path


def found(path: str, label: str | None = None, size: int = 10, source: str = "models") -> Candidate:
    name = path.rsplit("/", 1)[-1].removesuffix(".gguf")
    return Candidate(source, path, label or name, size, 0.0)  # type: ignore[arg-type]


# -- the plan (pure) ---------------------------------------------------------------------------


def test_ids_are_readable_and_never_hold_a_colon_or_a_slash() -> None:
    assert model_id("SmolLM2-135M-Instruct-F16") == "smollm2-135m-instruct-f16"
    assert model_id("hf-bartowski-Qwen2.5 7B:Q4_K_M") == "hf-bartowski-qwen2.5-7b-q4_k_m"
    assert model_id("ollama-llama3.2-latest") == "ollama-llama3.2-latest"
    assert model_id("--..") == "model"
    long = model_id("x" * 300)
    assert len(long) == 100 and long != model_id("x" * 299)  # cut, told apart by a hash
    assert split_part("big-00002-of-00003.gguf") == ("big", 2, 3)
    assert split_part("big.gguf") is None


def test_a_file_keeps_its_id_when_another_with_the_same_name_appears() -> None:
    first = plan_offer([found("/m/b/tiny.gguf")], previous={})
    assert [(m.id, m.path) for m in first.offered] == [("tiny", "/m/b/tiny.gguf")]
    # a file sorting before it, with the same name: the old one keeps "tiny" (MD2)
    second = plan_offer(
        [found("/m/a/tiny.gguf"), found("/m/b/tiny.gguf")], previous=first.by_path()
    )
    assert {m.path: m.id for m in second.offered} == {
        "/m/b/tiny.gguf": "tiny",
        "/m/a/tiny.gguf": "tiny-2",
    }
    # without that memory, the (source, path) order decides, the same way every time
    fresh = plan_offer([found("/m/b/tiny.gguf"), found("/m/a/tiny.gguf")], previous={})
    assert {m.path: m.id for m in fresh.offered} == {
        "/m/a/tiny.gguf": "tiny",
        "/m/b/tiny.gguf": "tiny-2",
    }


def test_a_configured_id_is_never_given_to_a_discovered_file() -> None:
    offer = plan_offer(
        [found("/m/alpha.gguf")], previous={"/m/alpha.gguf": "alpha"}, taken={"alpha"}
    )
    assert [m.id for m in offer.offered] == ["alpha-2"]


def test_a_complete_split_set_is_one_model_and_an_incomplete_one_is_refused() -> None:
    parts = [found(f"/m/big-0000{n}-of-00003.gguf", size=100) for n in (1, 2, 3)]
    offer = plan_offer(parts, previous={})
    assert offer.offered == (Offered("big", "/m/big-00001-of-00003.gguf", "models", 300),)
    assert offer.refused == ()
    broken = plan_offer([parts[0], parts[2]], previous={})
    assert broken.offered == ()
    assert broken.refused[0].path == "/m/big-00001-of-00003.gguf"
    assert broken.refused[0].reason == "split GGUF 'big': incomplete set, missing part(s) 2"
    tail_only = plan_offer([parts[1]], previous={})
    assert tail_only.refused[0].reason == "split GGUF 'big': incomplete set, missing part(s) 1, 3"
    elsewhere = plan_offer(
        [parts[0], parts[1], found("/other/big-00003-of-00003.gguf")], previous={}
    )
    assert elsewhere.offered == ()  # every part in the same folder


def test_a_projector_is_not_a_model_and_says_so() -> None:
    offer = plan_offer([found("/m/mmproj-model-f16.gguf"), found("/m/llava.gguf")], previous={})
    assert [m.id for m in offer.offered] == ["llava"]
    assert offer.refused[0].reason.startswith("a multimodal projector (mmproj), not a model")


def test_a_file_being_written_waits_and_the_offer_is_bounded() -> None:
    fresh = Candidate("models", "/m/new.gguf", "new", 10, 100.0)
    waiting = plan_offer([fresh], previous={}, now=101.0, settle=2.0)
    assert waiting.offered == () and "being written" in waiting.refused[0].reason
    assert [m.id for m in plan_offer([fresh], previous={}, now=103.0, settle=2.0).offered] == [
        "new"
    ]
    many = [found(f"/m/{n:03}.gguf") for n in range(10)]
    bounded = plan_offer(many, previous={}, limit=3)
    assert [m.id for m in bounded.offered] == ["000", "001", "002"]
    assert (
        len(bounded.refused) == 7
        and bounded.refused[0].reason == "over the 3 models discovery offers"
    )


def test_changes_and_their_replay_give_back_the_offer() -> None:
    a, b = Offered("a", "/a", "models", 1), Offered("b", "/b", "ollama", 2)
    moved = Offered("a", "/sub/a", "models", 1)
    assert offer_changes([a, b], [moved, b]) == ([moved], [a])
    recorded: list[tuple[list[object], list[object]]] = [
        (
            [
                {"id": "a", "path": "/a", "source": "models", "size": 1},
                {"id": "b", "path": "/b", "source": "ollama", "size": 2},
            ],
            [],
        ),
        (
            [{"id": "a", "path": "/sub/a", "source": "models", "size": 1}],
            [{"id": "a", "path": "/a", "source": "models", "size": 1}],
        ),
        (
            [
                {"id": "x", "path": 3},
                "junk",
                {"id": "y", "path": "/y", "source": "elsewhere", "size": 1},
            ],
            ["junk"],
        ),
    ]
    assert replay_offer(recorded) == (moved, b)


# -- the walk (real folders) ---------------------------------------------------------------------


def hf_cache(
    hub: Path, org: str, name: str, files: dict[str, bytes], revision: str = "abc123"
) -> Path:
    """A hub repo as huggingface_hub writes it: blobs, a snapshot of links to them, refs/main."""
    repo = hub / f"models--{org}--{name}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for n, (file, data) in enumerate(sorted(files.items())):
        blob = gguf(repo / "blobs" / f"{n:064x}", data)
        (snapshot / file).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def ollama_store(root: Path, name: str, tag: str, data: bytes, namespace: str = "library") -> Path:
    """An Ollama store: a manifest whose model layer names its blob, the blob, a projector."""
    digest = hashlib.sha256(data).hexdigest()  # Ollama names a blob by its content
    blob = gguf(root / "blobs" / f"sha256-{digest}", data)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "digest": "sha256:" + "cd" * 32,
            "size": 10,
        },
        "layers": [
            {"mediaType": OLLAMA_MODEL, "digest": f"sha256:{digest}", "size": len(data)},
            {
                "mediaType": "application/vnd.ollama.image.template",
                "digest": "sha256:" + "ef" * 32,
                "size": 5,
            },
        ],
    }
    where = root / "manifests" / "registry.ollama.ai" / namespace / name / tag
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(json.dumps(manifest))
    return blob


def test_the_walk_reads_each_source_as_its_program_lays_it_out(tmp_path: Path) -> None:
    models = tmp_path / "data" / "models"
    gguf(models / "SmolLM2-135M-Instruct-F16.gguf")
    gguf(models / "deep" / "er" / "Nested.gguf")
    (models / "notes.txt").write_text("not a model")
    gguf(models / "fake.gguf", b"PK\x03\x04 a zip")
    hub = tmp_path / "hf" / "hub"
    snapshot = hf_cache(
        hub, "bartowski", "SmolLM2-GGUF", {"SmolLM2-Q4_K_M.gguf": GGUF, "mmproj-f16.gguf": GGUF}
    )
    store = tmp_path / "ollama"
    blob = ollama_store(store, "llama3.2", "latest", GGUF + b"o")
    phi = ollama_store(store, "phi", "mini", GGUF + b"p", namespace="someone")
    lms = tmp_path / "lms"
    gguf(lms / "lmstudio-community" / "Qwen-GGUF" / "Qwen-Q8_0.gguf", GGUF + b"q")
    walked = walk_places(
        [
            ("models", models),
            ("huggingface", hub),
            ("ollama", store),
            ("lmstudio", lms),
            ("ollama", tmp_path / "nowhere"),
        ]
    )
    labels = {c.label: (c.source, c.path) for c in walked.candidates}
    assert labels == {
        "SmolLM2-135M-Instruct-F16": ("models", str(models / "SmolLM2-135M-Instruct-F16.gguf")),
        "Nested": ("models", str(models / "deep" / "er" / "Nested.gguf")),
        "hf-bartowski-SmolLM2-Q4_K_M": ("huggingface", str(snapshot / "SmolLM2-Q4_K_M.gguf")),
        "hf-bartowski-mmproj-f16": ("huggingface", str(snapshot / "mmproj-f16.gguf")),
        "ollama-llama3.2-latest": ("ollama", str(blob)),
        "ollama-someone-phi-mini": ("ollama", str(phi)),
        "lms-lmstudio-community-Qwen-Q8_0": (
            "lmstudio",
            str(lms / "lmstudio-community" / "Qwen-GGUF" / "Qwen-Q8_0.gguf"),
        ),
    }
    assert [(r.path, r.reason) for r in walked.refused] == [
        (str(models / "fake.gguf"), "not a GGUF file (it does not start with 'GGUF')")
    ]
    offer = plan_offer(walked.candidates, previous={})
    assert sorted(m.id for m in offer.offered) == [
        "hf-bartowski-smollm2-q4_k_m",
        "lms-lmstudio-community-qwen-q8_0",
        "nested",
        "ollama-llama3.2-latest",
        "ollama-someone-phi-mini",
        "smollm2-135m-instruct-f16",
    ]
    assert [r.reason for r in offer.refused] == [
        "a multimodal projector (mmproj), not a model: not offered"
    ]


def test_the_two_ollama_models_of_one_blob_are_one_file(tmp_path: Path) -> None:
    """Both manifests name the same blob: it is found once (a second link to one file)."""
    store = tmp_path / "ollama"
    ollama_store(store, "llama3.2", "latest", GGUF)
    ollama_store(store, "phi", "mini", GGUF, namespace="someone")
    walked = walk_places([("ollama", store)])
    assert [c.label for c in walked.candidates] == ["ollama-llama3.2-latest"]
    # the other tag is said, not dropped silently (Ollama keeps NAME:latest and NAME:3b as one)
    assert [r.reason for r in walked.refused] == [
        "ollama-someone-phi-mini: the same file as ollama-llama3.2-latest, offered once as that"
    ]


def test_a_discovery_folder_that_is_missing_or_a_file_is_said(tmp_path: Path) -> None:
    gguf(tmp_path / "model.gguf")
    walked = walk_places([("config", tmp_path / "nowhere"), ("config", tmp_path / "model.gguf")])
    assert [r.reason for r in walked.refused] == [
        "a [discovery] folder that does not exist",
        "a [discovery] folder that is not a folder",
    ]


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        ("{not json", "not JSON"),
        ('{"layers": 3}', f"no layer of media type {OLLAMA_MODEL}"),
        (
            '{"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "md5:x"}]}',
            "digest is not sha256",
        ),
        ("[" * 100_000, "not JSON"),
    ],
)
def test_a_broken_manifest_is_skipped_with_its_reason(
    tmp_path: Path, manifest: str, reason: str
) -> None:
    store = tmp_path / "ollama"
    ollama_store(store, "good", "latest", GGUF)
    bad = store / "manifests" / "registry.ollama.ai" / "library" / "bad" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text(manifest)
    walked = walk_places([("ollama", store)])
    assert [c.label for c in walked.candidates] == ["ollama-good-latest"]
    assert len(walked.refused) == 1 and walked.refused[0].path == str(bad)
    assert reason in walked.refused[0].reason


def test_a_manifest_whose_blob_is_missing_is_skipped(tmp_path: Path) -> None:
    store = tmp_path / "ollama"
    blob = ollama_store(store, "gone", "latest", GGUF)
    blob.unlink()
    walked = walk_places([("ollama", store)])
    assert walked.candidates == []
    assert "cannot be read (no such file or directory)" in walked.refused[0].reason


def test_a_link_loop_is_seen_and_not_followed(tmp_path: Path) -> None:
    models = tmp_path / "models"
    gguf(models / "a" / "one.gguf")
    (models / "a" / "loop").symlink_to(models)  # models/a/loop/a/loop/...
    (models / "self").symlink_to(".")
    (models / "dangling.gguf").symlink_to(tmp_path / "nothing")
    walked = walk_places([("models", models)])
    assert [c.label for c in walked.candidates] == ["one"]
    assert [(Path(r.path).name, r.reason) for r in walked.refused] == [
        ("dangling.gguf", "cannot be read (no such file or directory)")
    ]


def test_a_walk_cut_short_keeps_what_it_did_not_reach(tmp_path: Path) -> None:
    """A huge folder spends a place's entries: models past it were not seen, not gone (MD6).

    Broken once: 25,000 files in ``models/huge`` withdrew ``models/sub/alpha.gguf`` (its id then
    free for another file) though it was still there.
    """
    models = tmp_path / "models"
    gguf(models / "sub" / "alpha.gguf")
    gguf(models / "top.gguf")
    first = survey([("models", models)], before=(), taken=(), now=OLD + 7200, settle=2.0)
    assert [m.id for m in first.offer.offered] == ["alpha", "top"]
    (models / "huge").mkdir()  # scanned before sub/, it spends every entry
    for n in range(200):
        (models / "huge" / f"{n:04}.txt").touch()
    gguf(models / "sub" / "alpha-copy" / "alpha.gguf")  # would take "alpha" were it free
    later = survey(
        [("models", models)],
        before=first.offer.offered,
        taken=(),
        now=OLD + 7200,
        settle=2.0,
        max_entries=100,
    )
    assert later.offer.offered == first.offer.offered
    assert [r.reason[:27] for r in later.refused] == ["over 100 entries looked at:"]
    # a kept model's file deleted while the walk is still cut short: gone, not kept
    (models / "top.gguf").unlink()
    cut_again = survey(
        [("models", models)],
        before=later.offer.offered,
        taken=(),
        now=OLD + 7200,
        settle=2.0,
        max_entries=100,
    )
    assert [m.id for m in cut_again.offer.offered] == ["alpha"]
    gguf(models / "top.gguf")
    (models / "sub" / "alpha.gguf").unlink()  # gone for real: a whole walk withdraws it
    whole = survey(
        [("models", models)], before=later.offer.offered, taken=(), now=OLD + 7200, settle=2.0
    )
    assert [(m.id, Path(m.path).relative_to(models)) for m in whole.offer.offered] == [
        ("alpha", Path("sub/alpha-copy/alpha.gguf")),
        ("top", Path("top.gguf")),
    ]


def test_a_huge_or_deep_folder_is_cut_and_says_where(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for n in range(300):
        (models / f"{n:04}.txt").touch()
    gguf(models / "zz.gguf")
    walked = walk_places([("models", models)], max_entries=100)
    assert len(walked.refused) == 1
    assert walked.refused[0].reason.startswith("over 100 entries looked at")
    deep = tmp_path / "deep"
    gguf(deep.joinpath(*"abcdefghij") / "far.gguf")
    gguf(deep / "a" / "near.gguf")
    walked = walk_places([("models", deep)], max_depth=3)
    assert [c.label for c in walked.candidates] == ["near"]
    assert walked.refused[0].reason == "over 3 folders deep: not searched"


def test_an_unreadable_folder_is_skipped_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "models"
    gguf(models / "ok.gguf")
    locked = models / "locked"
    gguf(locked / "hidden.gguf")
    locked.chmod(0)
    if os.geteuid() == 0:  # root reads every folder: the kernel's refusal, as a user gets it
        real = os.scandir

        def scandir(path: Path) -> object:
            if Path(path) == locked:
                raise PermissionError(13, "Permission denied", str(path))
            return real(path)

        monkeypatch.setattr(os, "scandir", scandir)
    try:
        walked = walk_places([("models", models)])
    finally:
        locked.chmod(0o755)
    assert [c.label for c in walked.candidates] == ["ok"]
    assert [(r.path, r.reason) for r in walked.refused] == [
        (str(locked), "cannot be read (permission denied)")
    ]


def test_a_fifo_named_like_a_model_is_never_opened(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    os.mkfifo(models / "pipe.gguf")  # opening it would block the walk
    walked = walk_places([("models", models)])
    assert walked.candidates == []
    assert walked.refused[0].reason == "not a regular file"


def test_the_newest_snapshot_is_used_when_refs_main_is_missing(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    old = hf_cache(hub, "org", "m", {"m-Q4.gguf": GGUF}, revision="aaa111")
    (hub / "models--org--m" / "refs" / "main").unlink()
    new = hub / "models--org--m" / "snapshots" / "bbb222"
    new.mkdir()
    gguf(new / "m-Q8.gguf")
    os.utime(old, (OLD - 100, OLD - 100))
    walked = walk_places([("huggingface", hub)])
    assert [c.label for c in walked.candidates] == ["hf-org-m-Q8"]


# -- the catalog (records, replays, serves) ------------------------------------------------------


def catalog_of(
    data: Path,
    store: EventStore,
    places: list[tuple[Source, Path]],
    engines: tuple[EngineConfig, ...] = (),
) -> Catalog:
    config = DaemonConfig(
        data_dir=data,
        engines=engines,
        discovery=DiscoverySettings(places=tuple(places), rescan_seconds=0),
    )
    return Catalog(config, store, clock=SYSTEM_CLOCK, offloop=OffLoop())


def offered_events(store: EventStore) -> list[dict[str, object]]:
    return [r.payload for r in store.read_all(streams=[MODELS_STREAM])]


def file_of(catalog: Catalog, key: str) -> Path:
    engine = catalog.engine_config(key)
    assert engine is not None, key
    return engine.model


def ids(models: object) -> list[str]:
    assert isinstance(models, list)
    return [m["id"] for m in models]


def test_the_catalog_records_each_change_and_a_restart_keeps_the_ids(tmp_path: Path) -> None:
    models = tmp_path / "models"
    first = gguf(models / "b" / "tiny.gguf")
    configured = gguf(tmp_path / "alpha.gguf")
    alpha = EngineConfig(key="llamacpp:alpha:0", model=configured)

    async def main() -> None:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            catalog = catalog_of(tmp_path, store, [("models", models)], (alpha,))
            await catalog.open()
            assert dict(catalog) == {"alpha": "llamacpp:alpha", "tiny": "llamacpp:tiny"}
            assert catalog.about("tiny") == {"source": "models", "size_bytes": len(GGUF)}
            assert catalog.about("alpha") == {"source": "config", "size_bytes": len(GGUF)}
            engine = catalog.engine_config("llamacpp:tiny:0")
            assert engine is not None and engine.model == first and not engine.autostart
            assert catalog.engine_config("llamacpp:alpha:0") is None  # the config's own
            assert await catalog.scan() is False  # nothing changed: nothing recorded
            gguf(models / "a" / "tiny.gguf")  # sorts first, same name
            (models / "fresh.gguf").write_bytes(GGUF)  # being written: not yet
            assert await catalog.scan() is True
            assert catalog["tiny-2"] == "llamacpp:tiny-2"
            assert file_of(catalog, "llamacpp:tiny:0") == first
            assert "fresh" not in catalog
            first.unlink()
            assert await catalog.scan() is True
            assert "tiny" not in catalog and catalog.engine_config("llamacpp:tiny:0") is None
            events = offered_events(store)
            assert [(ids(e["added"]), ids(e["removed"])) for e in events] == [
                (["tiny"], []),
                (["tiny-2"], []),
                ([], ["tiny"]),
            ]
            assert events[1]["refused"] == [
                {
                    "path": str(models / "fresh.gguf"),
                    "reason": "being written (changed just now): offered once it settles",
                }
            ]
        gguf(models / "b" / "tiny.gguf")  # back, while no daemon ran
        os.utime(models / "fresh.gguf", (OLD, OLD))
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            again = catalog_of(tmp_path, store, [("models", models)])
            await again.open()
            # the file that was tiny-2 stays tiny-2; the one back takes the free "tiny"
            assert file_of(again, "llamacpp:tiny-2:0") == models / "a" / "tiny.gguf"
            assert file_of(again, "llamacpp:tiny:0") == models / "b" / "tiny.gguf"
            assert "fresh" in again  # settled meanwhile

    anyio.run(main)


def test_no_discovery_offers_the_configured_models_only(tmp_path: Path) -> None:
    gguf(tmp_path / "models" / "tiny.gguf")

    async def main() -> None:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            config = DaemonConfig(
                data_dir=tmp_path,
                engines=(EngineConfig(key="llamacpp:a:0", model=tmp_path / "x.gguf"),),
            )
            catalog = Catalog(config, store, clock=SYSTEM_CLOCK, offloop=OffLoop())
            await catalog.open()
            assert dict(catalog) == {"a": "llamacpp:a"}
            assert catalog.about("a") == {"source": "config", "size_bytes": None}  # no file
            assert await catalog.scan() is False
            await catalog.run()  # returns at once: nothing to rescan
            assert offered_events(store) == []

    anyio.run(main)


def test_the_no_models_hint_names_every_place_searched_and_whether_again() -> None:
    """A breaking helper: the hint named DATA_DIR/models only, promised a rescan that
    rescan_seconds = 0 turns off, and told a config's user to give a config."""
    from hostler.config import DiscoverySettings
    from hostler.daemon_parts.http_face import no_models_hint

    places: tuple[tuple[Source, Path], ...] = (
        ("models", Path("/d/models")),
        ("huggingface", Path("/h/hub")),
    )
    assert no_models_hint(DiscoverySettings(places=places)) == (
        "no models to serve yet: put a .gguf model in one of these (searched again every 5 s): "
        "models: /d/models; huggingface: /h/hub"
    )
    assert no_models_hint(DiscoverySettings(places=places[:1], rescan_seconds=0)) == (
        "no models to serve yet: put a .gguf model in one of these (searched at start only "
        "(rescan_seconds = 0): restart after adding one): models: /d/models"
    )
    assert no_models_hint(None).startswith("no models to serve: the config names none")
