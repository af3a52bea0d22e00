"""A fake of the GCE metadata server for the client's suite, as documented (and as the Rust
suite's tests/common/fake_metadata.rs copies it): the three keys the agent watches under
``/computeMetadata/v1/instance/``; ``Metadata-Flavor: Google`` required on the request (403
without) and sent on every answer; an ``ETag`` that is a hash of the value; and the long-poll
``?wait_for_change=true&last_etag=E&timeout_sec=N``, which answers at once when ``E`` is stale
and otherwise holds the request until the value changes or ``N`` seconds pass.
``upcoming-maintenance`` with nothing scheduled answers 503 with the real server's body.
"""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Optional
from urllib.parse import parse_qs, urlsplit

PREFIX = "/computeMetadata/v1/instance/"
NO_NOTIFICATIONS = '{ "error": "no notifications have been received yet, try again later" }'


def etag(value: Optional[str]) -> str:
    return hashlib.sha256((value if value is not None else "\0unset").encode()).hexdigest()[:16]


class FakeMetadata:
    def __init__(self) -> None:
        self.values: Dict[str, Optional[str]] = {
            "maintenance-event": "NONE",
            "upcoming-maintenance": None,
            "preempted": "FALSE",
        }
        self.changed = threading.Condition()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                url = urlsplit(self.path)
                key = url.path[len(PREFIX):] if url.path.startswith(PREFIX) else ""
                if self.headers.get("Metadata-Flavor") != "Google" or self.headers.get("X-Forwarded-For"):
                    return self.answer(403, "missing Metadata-Flavor: Google", None)
                if key not in fake.values:
                    return self.answer(404, "not found", None)
                q = parse_qs(url.query)
                value = fake.wait(key, q) if q.get("wait_for_change") == ["true"] else fake.values[key]
                if value is None:
                    return self.answer(503, NO_NOTIFICATIONS, etag(None))
                self.answer(200, value, etag(value))

            def answer(self, status: int, body: str, tag: Optional[str]) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(data)))
                if tag is not None:
                    self.send_header("ETag", tag)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the agent went away while its long-poll was held

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, key: str, q: Dict[str, list]) -> Optional[str]:
        timeout = float((q.get("timeout_sec") or ["300"])[0])
        with self.changed:
            last = (q.get("last_etag") or [None])[0]
            if last is None:
                last = etag(self.values[key])  # no ETag: the next change from now
            self.changed.wait_for(lambda: etag(self.values[key]) != last, timeout)
            return self.values[key]

    def set(self, key: str, value: Optional[str]) -> None:
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def close(self) -> None:
        with self.changed:
            self.changed.notify_all()
        self.server.shutdown()
        self.server.server_close()
