"""A fake ``sd-server`` (stable-diffusion.cpp's HTTP server), run as its own process.

It takes sd-server's launch flags (``--model`` or ``--diffusion-model``, the auxiliary files,
``--steps``, ``--vae-tiling``, ``--listen-ip``/``--listen-port``; ``--host``/``--port`` are
refused as the real one refuses them, IN41), loads for ``--fake-load-seconds`` before it opens
its port (as sd-server loads the model first), and answers ``GET /``, ``GET /v1/models``,
``POST /sdapi/v1/txt2img`` and ``POST /v1/images/generations``, spending
``--fake-seconds-per-image`` per image while printing sd-server's progress bars. Any other
flag is taken (a value follows unless the next token is a flag). Its HTTP skeleton is
:class:`hostler.testing.fake_server.JsonHandler`. Test support only.
"""

from __future__ import annotations

import base64
import json
import struct
import sys
import time
import zlib
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hostler.testing.fake_server import JsonHandler

VALUED = {"--model", "--diffusion-model", "--listen-ip", "--listen-port", "--steps"}


def shim(folder: Path) -> Path:
    """An executable ``#!`` script ``folder/sd-server`` that runs this fake (a binary to name)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sd-server"
    script = str(Path(__file__).resolve())
    path.write_text(
        f"#!{sys.executable}\nimport runpy\nrunpy.run_path({script!r}, run_name='__main__')\n"
    )
    path.chmod(0o755)
    return path


def parse(argv: list[str]) -> dict[str, Any]:
    """The flags, as sd-server would take them (exit 1 on --host/--port or no model)."""
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in {"--host", "--port"}:
            print(f"[ERROR] common.cpp:290 - error: unknown argument: {arg}", flush=True)
            sys.exit(1)
        if i + 1 < len(argv) and (arg in VALUED or not argv[i + 1].startswith("--")):
            flags[arg] = argv[i + 1]
            i += 2
        else:
            flags[arg] = True
            i += 1
    if "--model" not in flags and "--diffusion-model" not in flags:
        print(
            "[ERROR] common.cpp:615 - error: the following arguments are required: "
            "model_path/diffusion_model",
            flush=True,
        )
        sys.exit(1)
    return flags


def png() -> bytes:
    """A 1x1 black PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\x00\x00\x00"))
        + chunk(b"IEND", b"")
    )


def main() -> None:
    flags = parse(sys.argv[1:])
    per_image = float(flags.get("--fake-seconds-per-image", 0.2))
    steps = int(flags.get("--steps", 4))
    model = flags.get("--model") or flags.get("--diffusion-model")
    print(f"loading model from '{model}'", flush=True)
    time.sleep(float(flags.get("--fake-load-seconds", 0.0)))
    image = base64.b64encode(png()).decode()

    def render(count: int) -> list[str]:
        for _ in range(count):
            for step in range(1, steps + 1):
                time.sleep(per_image / steps)
                bar = "=" * (50 * step // steps)
                print(f"\r  |{bar:<50}| {step}/{steps} - {per_image / steps:.2f}s/it", flush=True)
        return [image] * count

    class Handler(JsonHandler):
        def error_body(self, status: int, message: str) -> object:
            """sd-server's error shape: ``{"error": message}``."""
            del status
            return {"error": message}

        def do_GET(self) -> None:
            if self.path == "/":
                self.send_json(200, {"fake": "sd-server"})
            elif self.path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [{"id": "sd-cpp-local"}]})
            else:
                self.send_error_json(404, "not found")

        def do_POST(self) -> None:
            raw = self.read_body()
            if raw is None:
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self.send_error_json(400, "invalid json")
                return
            if self.path in {"/sdapi/v1/txt2img", "/sdapi/v1/img2img"}:
                images = render(int(body.get("batch_size", 1)))
                self.send_json(200, {"images": images, "parameters": body, "info": "{}"})
            elif self.path == "/v1/images/generations":
                images = render(int(body.get("n", 1)))
                data = [{"b64_json": b64} for b64 in images]
                self.send_json(200, {"created": int(time.time()), "data": data})
            else:
                self.send_error_json(404, "not found")

    server = ThreadingHTTPServer((flags["--listen-ip"], int(flags["--listen-port"])), Handler)
    print(f"listening on: {flags['--listen-ip']}:{flags['--listen-port']}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
