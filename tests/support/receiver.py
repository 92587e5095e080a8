"""A webhook receiver on 127.0.0.1 (``http.server``): the real HTTP end of the alert tests
(zbak's webhook sink and apprise's ``json://``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """Records each POST; answers ``fail_first`` 503s first; holds every answer while
    ``release`` is clear (it is set: clear it to hold, set it to let them go, 60 s at most).

    Args:
        path: the URL path it is reached at (``url`` is ``http://127.0.0.1:PORT`` + path).
        flush: called before ``posts`` is read (to deliver queued alerts first).
    """

    def __init__(self, path: str = "/", flush: Callable[[], None] = lambda: None):
        self._posts: list[tuple[str, dict, dict]] = []
        self._flush = flush
        self.fail_first = 0
        self.release = threading.Event()
        self.release.set()
        self.arrived = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.release.wait(60)
                if receiver.fail_first > 0:
                    receiver.fail_first -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                receiver._posts.append((self.path, dict(self.headers), json.loads(body)))
                receiver.arrived.set()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.address = f"127.0.0.1:{self.server.server_port}"
        self.url = f"http://{self.address}{path}"

    @property
    def posts(self) -> list[tuple[str, dict, dict]]:
        """(path, headers, JSON body) of every POST received, once queued alerts are out."""
        self._flush()
        return self._posts

    def close(self):
        self.server.shutdown()
        self.server.server_close()
