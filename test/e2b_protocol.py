"""The exchanges E2B's Python SDK makes with the control API and envd, written with the standard
library (the SDK itself cannot be installed on the build host: no PyPI). Read from its sources
(e2b-dev/E2B packages/python-sdk): POST /sandboxes with the body of sandbox_sync/sandbox_api.py,
envd's process service over Connect with the JSON codec of envd/client_shared.py, and /files as
sandbox_sync/filesystem/filesystem.py uploads (multipart, one part named "file", `?path=`) and
watches (sandbox_sync/filesystem/watch_handle.py: CreateWatcher, then GetWatcherEvents polled,
RemoveWatcher to stop), and get_metrics (GET /sandboxes/{id}/metrics).

  python3 e2b_protocol.py run URL KEY      -> prints a JSON summary of what it saw
  python3 e2b_protocol.py kill URL KEY ID TOKEN
"""

import base64
import json
import struct
import sys
import time
import urllib.error
import urllib.request


def call(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as res:
            return res.status, res.headers, res.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def envd_headers(sid, token, extra=None):
    h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
    h.update(extra or {})
    return h


def envelope(message):
    data = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(data)) + data


def unenvelope(raw):
    out, at = [], 0
    while at < len(raw):
        flags, size = struct.unpack(">BI", raw[at : at + 5])
        out.append((flags, json.loads(raw[at + 5 : at + 5 + size])))
        at += 5 + size
    return out


def start(url, sid, token, script, keepalive="50"):
    body = envelope({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", script], "envs": {}}, "stdin": False})
    headers = envd_headers(
        sid,
        token,
        {
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            "Connect-Timeout-Ms": "60000",
            "Keepalive-Ping-Interval": keepalive,
            "Authorization": "Basic " + base64.b64encode(b"root:").decode(),
        },
    )
    status, hdrs, raw = call("POST", f"{url}/process.Process/Start", body, headers)
    frames = unenvelope(raw) if status == 200 else []
    events = [m.get("event", {}) for f, m in frames if not f & 2]
    out = b"".join(base64.b64decode(e["data"].get("stdout", "")) for e in events if "data" in e)
    err = b"".join(base64.b64decode(e["data"].get("stderr", "")) for e in events if "data" in e)
    end = next((e["end"] for e in events if "end" in e), None)
    return {
        "status": status,
        "contentType": hdrs.get("Content-Type"),
        "first": list(events[0].keys())[0] if events else None,
        "stdout": out.decode(),
        "stderr": err.decode(),
        "end": end,
        "trailer": frames[-1] if frames else None,
        "keepalives": sum(1 for e in events if "keepalive" in e),
    }


def multipart(path, data):
    boundary = "----e2bpython"
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{path}"\r\n'
    head += "Content-Type: application/octet-stream\r\n\r\n"
    body = head.encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def run(url, key):
    api = {"X-API-Key": key, "Content-Type": "application/json"}
    new = {"templateID": "base", "timeout": 120, "metadata": {"sdk": "python"}, "envVars": {"PY": "1"}, "secure": True}
    status, _, raw = call("POST", f"{url}/sandboxes", json.dumps(new).encode(), api)
    created = json.loads(raw)
    sid, token = created["sandboxID"], created["envdAccessToken"]
    summary = {"create": status, "sandboxID": sid, "token": token, "envdVersion": created["envdVersion"]}
    summary["run"] = start(url, sid, token, "echo py-$PY > /tmp/py-ran; cat /tmp/py-ran; echo e >&2; exit 7")
    summary["quiet"] = start(url, sid, token, "sleep 2.5", keepalive="1")
    unary = envd_headers(sid, token, {"Content-Type": "application/json", "Connect-Protocol-Version": "1"})
    fs = f"{url}/filesystem.Filesystem"
    status, _, _ = call("POST", f"{fs}/MakeDir", json.dumps({"path": "/srv"}).encode(), unary)
    summary["makeDir"] = status
    status, _, raw = call("POST", f"{fs}/CreateWatcher", json.dumps({"path": "/srv", "recursive": True}).encode(), unary)
    watcher = json.loads(raw).get("watcherId")
    summary["createWatcher"] = [status, watcher]
    body, ctype = multipart("/srv/py.txt", b"written by python")
    status, _, raw = call("POST", f"{url}/files?path=/srv/py.txt", body, envd_headers(sid, token, {"Content-Type": ctype}))
    summary["upload"] = [status, json.loads(raw)]
    status, _, raw = call("GET", f"{url}/files?path=/srv/py.txt", None, envd_headers(sid, token))
    summary["download"] = [status, raw.decode()]
    # polled, as the SDK's get_new_events is: the events come as they happen
    events, status, deadline = [], 0, time.monotonic() + 10
    while len(events) < 2 and time.monotonic() < deadline:
        status, _, raw = call("POST", f"{fs}/GetWatcherEvents", json.dumps({"watcherId": watcher}).encode(), unary)
        events += json.loads(raw).get("events", []) if status == 200 else []
        time.sleep(0.05)
    summary["watcherEvents"] = [status, {"events": events}]
    status, _, raw = call("POST", f"{fs}/RemoveWatcher", json.dumps({"watcherId": watcher}).encode(), unary)
    summary["removeWatcher"] = [status, json.loads(raw)]
    status, _, raw = call("GET", f"{url}/sandboxes/{sid}/metrics", None, api)
    summary["metrics"] = [status, json.loads(raw)]
    status, _, raw = call("POST", f"{url}/filesystem.Filesystem/ListDir", json.dumps({"path": "/srv", "depth": 1}).encode(), unary)
    summary["listDir"] = [status, sorted(e["name"] for e in json.loads(raw)["entries"])]
    status, _, raw = call("POST", f"{url}/filesystem.Filesystem/Stat", json.dumps({"path": "/nope"}).encode(), unary)
    summary["statMissing"] = [status, json.loads(raw)]
    status, _, _ = call("GET", f"{url}/files?path=/srv/py.txt", None, envd_headers(sid, "0" * 48))
    summary["wrongToken"] = status
    status, _, raw = call("GET", f"{url}/sandboxes/{sid}", None, api)
    summary["info"] = [status, json.loads(raw)]
    print(json.dumps(summary))


def kill(url, key, sid, token):
    status, _, _ = call("DELETE", f"{url}/sandboxes/{sid}", None, {"X-API-Key": key})
    again, _, raw = call("DELETE", f"{url}/sandboxes/{sid}", None, {"X-API-Key": key})
    health, _, _ = call("GET", f"{url}/health", None, envd_headers(sid, token))
    print(json.dumps({"kill": status, "again": [again, json.loads(raw)], "health": health}))


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3])
    else:
        kill(*sys.argv[2:6])
