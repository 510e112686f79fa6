"""A stand-in engine for supervisor tests that need no model: a tiny HTTP server."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from hostler.plugin import EngineAdapter, LaunchCommand, LaunchSpec

#: Answers /health, prints ``n`` lines of output on GET /spam/<n>, and echoes every other
#: path it is asked for.
SCRIPT = textwrap.dedent(
    """
    import http.server, sys

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/spam/"):
                for i in range(int(self.path.split("/")[2])):
                    sys.stdout.write(f"spam {i:08d} " + "x" * 100 + "\\n")
            elif self.path != "/health":
                sys.stdout.write(f"asked for {self.path}\\n")
            sys.stdout.flush()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    print("fake engine listening", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


class FakeEngine(EngineAdapter):
    """Runs :data:`SCRIPT` (written into ``folder``) on the port hostler chose."""

    engine_type = "fake"

    def __init__(self, folder: Path) -> None:
        self.script = folder / "fake_engine.py"
        self.script.write_text(SCRIPT)

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        return LaunchCommand([sys.executable, str(self.script), str(spec.port)])


#: Holds ``argv[2]`` MiB of touched memory (so its measured footprint is known), waits
#: ``argv[3]`` seconds before it listens, then answers /health and, on /busy/<seconds>, replies
#: after that long (a request that keeps the engine busy).
BALLAST_SCRIPT = textwrap.dedent(
    """
    import http.server, socketserver, sys, time

    ballast = bytearray(int(sys.argv[2]) * 1024 * 1024)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    time.sleep(float(sys.argv[3]))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/busy/"):
                time.sleep(float(self.path.split("/")[2]))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    print("ballast engine listening", flush=True)
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


class BallastEngine(EngineAdapter):
    """Runs :data:`BALLAST_SCRIPT`: an engine of a known size that can be slow to load."""

    engine_type = "ballast"

    def __init__(self, folder: Path, mib: int = 0, load_seconds: float = 0.0) -> None:
        self.script = folder / "ballast_engine.py"
        self.script.write_text(BALLAST_SCRIPT)
        self.mib = mib
        self.load_seconds = load_seconds

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        return LaunchCommand(
            [
                sys.executable,
                str(self.script),
                str(spec.port),
                str(self.mib),
                str(self.load_seconds),
            ]
        )
