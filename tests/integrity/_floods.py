"""Scripts run inside sandboxes by the listener-flood tests and bench/listener_flood.py: the
flooder's (connections, bodies) and the bystander's timed requests. Each prints one JSON
line."""

# In the flooding sandbox: open connections to PORT for HOLD seconds as fast as possible,
# keep every one the server accepts; "tunnel" sends a CONNECT, "silent" sends nothing.
FLOOD = r"""
import json, socket, sys, time
kind, host, port, target, hold = sys.argv[1], "127.0.0.1", int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
kept, refused, errors, closed_by_server = [], 0, 0, 0
end = time.monotonic() + hold
while time.monotonic() < end and len(kept) + refused + errors < 1_000_000:
    try:
        s = socket.create_connection((host, port), timeout=5)
        if kind == "tunnel":
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            line = s.recv(64)
            if b" 200 " in line:
                kept.append(s)
            else:
                refused += 1; s.close()
        else:
            s.setblocking(False)
            kept.append(s)
    except OSError:
        errors += 1
if kind == "silent":
    time.sleep(3)  # past the header timeout: each one refused or closed by the server by now
    still_open = []
    for s in kept:
        try:
            data = s.recv(64)
            refused += data.startswith(b"HTTP/1.1 503")
            closed_by_server += not data.startswith(b"HTTP/1.1 503")
        except BlockingIOError:
            still_open.append(s)
        except OSError:
            closed_by_server += 1
    kept = still_open
print(json.dumps({"kind": kind, "kept": len(kept), "refused": refused, "errors": errors,
                  "closed_by_server": closed_by_server}))
"""

# In the bystander sandbox: N sequential requests through its egress proxy, each timed.
PROBE = r"""
import json, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
out = []
for _ in range(n):
    t = time.monotonic()
    with urllib.request.urlopen(url, timeout=30) as r:
        r.read()
    out.append(time.monotonic() - t)
print(json.dumps(out))
"""


# In the flooding sandbox: rounds of CONCURRENT posts of a SIZE-byte Anthropic body to the
# session listener at BASE, all at once, for SECONDS; each outcome is a status or the
# connection error.
BODY_FLOOD = r"""
import collections, http.client, json, sys, threading, time
base, concurrent, size, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
host, port = base.removeprefix("http://").split(":")
text = "a " * (size // 2)
body = json.dumps({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": text}]}).encode()
outcomes, shapes, lock = collections.Counter(), set(), threading.Lock()
start = threading.Barrier(concurrent)
def post():
    try:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        start.wait()
        conn.request("POST", "/v1/messages", body, {"content-type": "application/json", "anthropic-version": "2023-06-01"})
        r = conn.getresponse()
        answer = json.loads(r.read() or b"{}")
        with lock:
            outcomes[r.status] += 1
            shapes.add((r.status, answer.get("type"), answer.get("error", {}).get("type")))
    except OSError as e:
        with lock:
            outcomes[type(e).__name__] += 1
end = time.monotonic() + seconds
while time.monotonic() < end:
    start.reset()
    threads = [threading.Thread(target=post) for _ in range(concurrent)]
    [t.start() for t in threads]; [t.join() for t in threads]
print(json.dumps({"outcomes": outcomes, "shapes": sorted(map(list, shapes))}))
"""

CHAT_PROBE = r"""
import http.client, json, sys, time
base, n = sys.argv[1], int(sys.argv[2])
host, port = base.removeprefix("http://").split(":")
body = json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
out = []
for _ in range(n):
    t = time.monotonic()
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    r = conn.getresponse(); r.read(); conn.close()
    assert r.status == 200, r.status
    out.append(time.monotonic() - t)
print(json.dumps(out))
"""
