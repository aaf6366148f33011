"""A tiny key-value store: GET /ready (after a warm-up), GET/PUT /<key>."""

import argparse
import http.server
import time

parser = argparse.ArgumentParser()
parser.add_argument("--warmup", type=float, default=0.0)
args = parser.parse_args()
READY_AT = time.monotonic() + args.warmup
DATA = {"items": b'[{"id": 1, "name": "alpha"}, {"id": 2, "name": "bravo"}]'}


class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/ready":
            ready = time.monotonic() >= READY_AT
            self._send(200 if ready else 503, b"ready" if ready else b"warming up")
        elif self.path.lstrip("/") in DATA:
            self._send(200, DATA[self.path.lstrip("/")])
        else:
            self._send(404, b"no such key")

    def do_PUT(self) -> None:
        DATA[self.path.lstrip("/")] = self.rfile.read(int(self.headers["Content-Length"]))
        self._send(204, b"")


http.server.ThreadingHTTPServer(("0.0.0.0", 6000), Handler).serve_forever()
