"""A webhook receiver on 127.0.0.1 recording the JSON body of every alert zbak POSTs to it:
how a test sees the alerts of a ``zbak`` process (``[alerts.webhook] url = hook.url``)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Webhook:
    """Listens on a free port of 127.0.0.1 from construction until ``close()``.

    Attributes:
        url: the URL to put in the config.
        bodies: every JSON body received, in order of arrival.
    """

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's naming
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def failures(self, action: str, *, wait: float = 10.0) -> list[dict[str, Any]]:
        """The ``failure`` alerts about ``action`` received, waiting up to ``wait`` seconds
        for a first one (zbak posts before it exits, so a finished process's are here)."""
        deadline = time.monotonic() + wait
        while True:
            found = [b for b in self.bodies
                     if b.get("kind") == "failure" and b.get("action") == action]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    def close(self) -> None:
        """Stop listening."""
        self.server.shutdown()
        self.server.server_close()
