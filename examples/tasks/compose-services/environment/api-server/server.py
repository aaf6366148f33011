"""REST API over the kv service: GET /items, POST /items {"name": ...}. It reads kv once at
start and exits when kv is not there yet, so it works only when started after kv is ready."""

import http.server
import json
import os
import urllib.request

KV = os.environ["KV_URL"]
with urllib.request.urlopen(f"{KV}/items", timeout=5) as r:  # fails unless kv is up
    ITEMS = json.loads(r.read())


class Handler(http.server.BaseHTTPRequestHandler):
    def _json(self, code: int, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/items":
            self._json(200, ITEMS)
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        if self.path != "/items":
            return self._json(404, {"error": "not found"})
        data = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        item = {"id": max((i["id"] for i in ITEMS), default=0) + 1, "name": str(data["name"])}
        ITEMS.append(item)
        body = json.dumps(ITEMS).encode()
        req = urllib.request.Request(f"{KV}/items", data=body, method="PUT")
        urllib.request.urlopen(req, timeout=5).close()
        self._json(201, item)


http.server.ThreadingHTTPServer(("0.0.0.0", 5000), Handler).serve_forever()
