"""Models you already have, as a new user meets them: a real ``hostler serve`` with no config.

Real folders laid out as each program leaves them (the data directory's models folder, nested;
the Hugging Face hub cache; Ollama's store of manifests and blobs; LM Studio's folder), real
GGUF files, the real ``llama-server``, the official ``openai`` client and the real CLI. A file
copied in while the daemon runs is offered without a restart; a file removed is not.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from hostler.testing.tiny_gguf import write_tiny_llama

from _support import untermed

pytestmark = pytest.mark.slow

HOSTLER = [sys.executable, "-c", "import sys; from hostler.cli import main; sys.exit(main())"]
REVISION = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Served:
    """The daemon, its URL, its folders and the files put where users keep models."""

    base: str
    home: Path
    data: Path
    daemon: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]

    def models(self) -> dict[str, dict[str, object]]:
        listed = httpx.get(f"{self.base}/v1/models", timeout=30).json()["data"]
        return {str(m["id"]): m for m in listed}

    def cli(self, *words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*HOSTLER, *words, "--url", self.base],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            check=False,
        )

    def offered_soon(self, wanted: set[str], gone: frozenset[str] = frozenset()) -> None:
        """Wait (the daemon's rescan: every 5 s by default) until ``wanted`` are offered."""
        deadline = time.monotonic() + 60
        while True:
            ids = set(self.models())
            if wanted <= ids and not gone & ids:
                return
            assert self.daemon.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, (sorted(ids), self.log.read_text()[-3000:])
            time.sleep(0.2)


def _lay_out(home: Path, data: Path, model: Path) -> None:
    """The user's folders, each as its program lays it out, holding copies of ``model``."""
    nested = data / "models" / "family" / "q8"
    nested.mkdir(parents=True)
    shutil.copy(model, nested / "Tiny-Chat-Q8_0.gguf")
    (data / "models" / "mmproj-tiny-f16.gguf").write_bytes(model.read_bytes()[:4096])
    (data / "models" / "big-00001-of-00002.gguf").write_bytes(model.read_bytes()[:4096])
    repo = home / ".cache" / "huggingface" / "hub" / "models--bartowski--Tiny-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    (repo / "snapshots" / REVISION).mkdir(parents=True)
    shutil.copy(model, repo / "snapshots" / REVISION / "tiny-Q4_K_M.gguf")
    store = home / ".ollama" / "models"
    blob = model.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    (store / "blobs").mkdir(parents=True)
    (store / "blobs" / f"sha256-{digest}").write_bytes(blob)
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "tinyllama"
    manifest.mkdir(parents=True)
    (manifest / "latest").write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "layers": [
                    {
                        "mediaType": "application/vnd.ollama.image.model",
                        "digest": f"sha256:{digest}",
                        "size": len(blob),
                    }
                ],
            }
        )
    )
    studio = home / ".lmstudio" / "models" / "lmstudio-community" / "Tiny-GGUF"
    studio.mkdir(parents=True)
    shutil.copy(model, studio / "Tiny-Q8_0.gguf")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    home, data = tmp_path / "user", tmp_path / "data"
    _lay_out(home, data, model)
    env = {
        **untermed(os.environ),
        "HOME": str(home),
        "HOSTLER_HOME": str(data),
        "COLUMNS": "80",
    }
    for variable in ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "OLLAMA_MODELS"):
        env.pop(variable, None)
    port, log = free_port(), tmp_path / "serve.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            [*HOSTLER, "serve", "--port", str(port)], stdout=out, stderr=out, env=env
        )
    it = Served(f"http://127.0.0.1:{port}", home, data, daemon, log, env)
    try:
        deadline = time.monotonic() + 60
        while True:  # polled: the daemon answers /health once it listens
            assert daemon.poll() is None, log.read_text()
            try:
                if httpx.get(f"{it.base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "hostler serve did not listen in 60 s"
            time.sleep(0.1)
        yield it
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0, log.read_text()[-3000:]


def free_port() -> int:
    """A free loopback port (the socket that found it is closed before the daemon binds)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_every_place_a_user_keeps_models_is_offered_and_served(served: Served) -> None:
    models = served.models()
    size = (served.data / "models" / "family" / "q8" / "Tiny-Chat-Q8_0.gguf").stat().st_size
    assert {m: (v["source"], v["size_bytes"]) for m, v in models.items()} == {
        "tiny-chat-q8_0": ("models", size),
        "hf-bartowski-tiny-q4_k_m": ("huggingface", size),
        "ollama-tinyllama-latest": ("ollama", size),
        "lms-lmstudio-community-tiny-q8_0": ("lmstudio", size),
    }
    # the projector and the incomplete split set are refused by name in the serve log
    text = served.log.read_text()
    assert "mmproj-tiny-f16.gguf: a multimodal projector (mmproj), not a model" in text
    assert "split GGUF 'big': incomplete set, missing part(s) 2" in text

    client = openai.OpenAI(base_url=f"{served.base}/v1", api_key="x", max_retries=0, timeout=120)
    hi: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    answer = client.chat.completions.create(
        model="ollama-tinyllama-latest", messages=hi, max_tokens=4
    )
    assert answer.model == "ollama-tinyllama-latest"
    chunks = list(
        client.chat.completions.create(
            model="tiny-chat-q8_0", messages=hi, max_tokens=4, stream=True
        )
    )
    assert chunks and all(c.model == "tiny-chat-q8_0" for c in chunks)
    vectors = client.embeddings.create(model="tiny-chat-q8_0", input="hello")
    assert len(vectors.data) == 1 and len(vectors.data[0].embedding) > 0

    table = served.cli("models")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["MODEL", "SOURCE", "SIZE", "RESIDENT", "RESERVED"]
    assert all(len(line) <= 80 for line in lines), lines
    shown = f"{size / 1024:.1f} KiB"
    rows = {line.split()[0]: line for line in lines[1:]}
    assert re.match(rf"tiny-chat-q8_0 +models +{shown} +yes +\S", rows["tiny-chat-q8_0"])
    hub = rows["hf-bartowski-tiny-q4_k_m"]
    assert re.match(rf"hf-bartowski-tiny-q4_k_m +huggingface +{shown} +no +-", hub)

    # a found model never loaded is previewed by its id (its first engine)
    preview = served.cli("preview", "hf-bartowski-tiny-q4_k_m", "--json")
    assert preview.returncode == 0, preview.stderr
    assert json.loads(preview.stdout)["key"] == "hf-bartowski-tiny-q4_k_m"
    assert json.loads(preview.stdout)["reserved_bytes"] > size

    unloaded = served.cli("unload", "tiny-chat-q8_0")
    assert unloaded.returncode == 0, unloaded.stderr
    assert unloaded.stdout.strip() == "llamacpp:tiny-chat-q8_0:0: unloaded"
    not_loaded = served.cli("unload", "hf-bartowski-tiny-q4_k_m")
    assert not_loaded.stdout.strip() == "hf-bartowski-tiny-q4_k_m: was not loaded"
    unknown = served.cli("unload", "nothing-of-the-sort")
    assert unknown.returncode == 2 and unknown.stderr.startswith(
        "hostler: error [usage.invalid]: unload: 'nothing-of-the-sort' is neither a model id nor "
        "an engine key (models: hf-bartowski-tiny-q4_k_m, lms-lmstudio-community-tiny-q8_0, "
    )


def test_a_file_copied_in_while_serving_is_offered_and_one_removed_is_not(
    served: Served,
) -> None:
    before = served.models()
    source = served.data / "models" / "family" / "q8" / "Tiny-Chat-Q8_0.gguf"
    # copied as a user copies: to a temporary name, then renamed into place
    partial = served.data / "models" / ".incoming.part"
    shutil.copy(source, partial)
    partial.rename(served.data / "models" / "Second-Model.gguf")
    served.offered_soon({"second-model", *before})
    client = openai.OpenAI(base_url=f"{served.base}/v1", api_key="x", max_retries=0, timeout=120)
    answer = client.chat.completions.create(
        model="second-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert answer.model == "second-model"

    studio = served.home / ".lmstudio" / "models" / "lmstudio-community" / "Tiny-GGUF"
    (studio / "Tiny-Q8_0.gguf").unlink()
    served.offered_soon({"second-model"}, gone=frozenset({"lms-lmstudio-community-tiny-q8_0"}))
    # an engine running a model whose file went finishes, and an unload by its id stops it
    client.chat.completions.create(
        model="tiny-chat-q8_0", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    source.unlink()
    served.offered_soon(set(), gone=frozenset({"tiny-chat-q8_0"}))
    unloaded = served.cli("unload", "tiny-chat-q8_0")
    assert unloaded.stdout.strip() == "llamacpp:tiny-chat-q8_0:0: unloaded", unloaded.stderr
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="lms-lmstudio-community-tiny-q8_0",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
        )
    # a model no longer offered is not previewed, by id or by key: 404, never a crash
    for name in ("lms-lmstudio-community-tiny-q8_0", "llamacpp:lms-lmstudio-community-tiny-q8_0:0"):
        gone = httpx.get(f"{served.base}/api/preview/{name}", timeout=30)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    # the changes are in the log, whose story the terminal told
    text = served.log.read_text()
    assert "offering second-model (models:" in text
    assert "no longer offering lms-lmstudio-community-tiny-q8_0" in text
