"""The exchanges E2B's Python SDK makes with the control API and envd, written with the standard
library (the SDK itself cannot be installed on the build host: no PyPI). Read from its sources
(e2b-dev/E2B packages/python-sdk): POST /sandboxes with the body of sandbox_sync/sandbox_api.py,
envd's process service over Connect with the JSON codec of envd/client_shared.py, and /files as
sandbox_sync/filesystem/filesystem.py uploads (multipart, one part named "file", `?path=`) and
watches (sandbox_sync/filesystem/watch_handle.py: CreateWatcher, then GetWatcherEvents polled,
RemoveWatcher to stop), get_metrics (GET /sandboxes/{id}/metrics), a background command
(commands.run(background=True): Start's stream read as it comes, in a thread in the SDK), list,
send_signal, Move and Remove, and the control calls set_timeout, pause, connect and list
(GET /v2/sandboxes with `metadata` as k=v, url-encoded).

  python3 e2b_protocol.py run URL KEY      -> prints a JSON summary of what it saw
  python3 e2b_protocol.py kill URL KEY ID TOKEN
"""

import base64
import http.client
import json
import struct
import sys
import time
import urllib.error
import urllib.parse
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


def background(url, sid, token, script):
    """Start read as a stream: the start event (its pid) first, while the command runs; then the rest."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    body = envelope({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", script], "envs": {}}, "stdin": False})
    headers = envd_headers(sid, token, {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"})
    conn.request("POST", "/process.Process/Start", body, headers)
    res = conn.getresponse()

    def frame():
        flags, size = struct.unpack(">BI", res.read(5))
        return flags, json.loads(res.read(size))

    flags, first = frame()
    pid = first["event"]["start"]["pid"]

    def rest():
        events = []
        while True:
            flags, m = frame()
            if flags & 2:
                conn.close()
                return events
            events.append(m.get("event", {}))

    return pid, rest


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
    try:
        exchanges(url, api, sid, token, summary)
    except BaseException:
        # nothing left behind when a step fails: the sandbox goes before the error is told
        call("DELETE", f"{url}/sandboxes/{sid}", None, {"X-API-Key": key})
        raise
    print(json.dumps(summary))


def exchanges(url, api, sid, token, summary):
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
    # a background command: listed, then killed by a signal, its stream ending with how it ended
    pid, rest = background(url, sid, token, "sleep 4242")
    proc = f"{url}/process.Process"
    status, _, raw = call("POST", f"{proc}/List", b"{}", unary)
    summary["list"] = [status, [p["pid"] for p in json.loads(raw).get("processes", [])], pid]
    signal = {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
    status, _, raw = call("POST", f"{proc}/SendSignal", json.dumps(signal).encode(), unary)
    summary["sendSignal"] = [status, json.loads(raw)]
    summary["killedEnd"] = next((e["end"] for e in rest() if "end" in e), None)
    # Move and Remove (a second Remove of the same path succeeds too)
    move = {"source": "/srv/py.txt", "destination": "/srv/moved.txt"}
    status, _, raw = call("POST", f"{fs}/Move", json.dumps(move).encode(), unary)
    summary["move"] = [status, json.loads(raw)]
    status, _, _ = call("POST", f"{fs}/Remove", json.dumps({"path": "/srv/moved.txt"}).encode(), unary)
    again, _, _ = call("POST", f"{fs}/Remove", json.dumps({"path": "/srv/moved.txt"}).encode(), unary)
    summary["remove"] = [status, again]
    # the control calls
    status, _, _ = call("POST", f"{url}/sandboxes/{sid}/timeout", json.dumps({"timeout": 300}).encode(), api)
    summary["setTimeout"] = status
    query = urllib.parse.urlencode({"metadata": "sdk=python", "state": "running"})
    status, _, raw = call("GET", f"{url}/v2/sandboxes?{query}", None, api)
    summary["listed"] = [status, [s["sandboxID"] for s in json.loads(raw)]]
    status, _, raw = call("POST", f"{url}/sandboxes/{sid}/connect", json.dumps({"timeout": 60}).encode(), api)
    summary["connectRunning"] = [status, json.loads(raw).get("envdAccessToken") == token]
    status, _, _ = call("POST", f"{url}/sandboxes/{sid}/pause", None, api)
    again, _, raw = call("POST", f"{url}/sandboxes/{sid}/pause", None, api)
    summary["pause"] = [status, again, json.loads(raw).get("code")]
    status, _, _ = call("GET", f"{url}/health", None, envd_headers(sid, token))
    summary["healthPaused"] = status
    status, _, raw = call("POST", f"{url}/sandboxes/{sid}/connect", json.dumps({"timeout": 60}).encode(), api)
    summary["connectPaused"] = [status, json.loads(raw).get("envdAccessToken") == token]
    summary["afterResume"] = start(url, sid, token, "cat /tmp/py-ran")["stdout"]


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
