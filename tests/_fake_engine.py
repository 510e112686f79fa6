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
