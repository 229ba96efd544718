"""The request handler the test servers share: JSON answers with a length, and no access log.

Standard library only: `tests/stages/sglang_standin.py` runs it in a process of its own.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


class JSONHandler(BaseHTTPRequestHandler):
    """Subclass it with ``do_GET``/``do_POST``; answer with ``self.send_json(status, payload)``."""

    def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass  # a test's output is the test's, not a line per request
