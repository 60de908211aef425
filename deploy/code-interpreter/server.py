#!/usr/bin/env python3
"""snaplab's code interpreter: E2B's code-interpreter protocol (docs/e2b.md) over Jupyter kernels.

Runs inside a sandbox on 127.0.0.1:49999 (the E2B front carries the SDK's requests to it). Python's
standard library and Debian's python3-jupyter-client only. One kernel per context; the default
context ("python") is started with the server. A context's kernel that dies does not end another's;
a client that goes away (the SDK's timeout) interrupts its kernel, and the sandbox runs on.

  POST /execute            {code, context_id?, language?, env_vars?, global_env_vars?} -> NDJSON lines
                           (global_env_vars: the sandbox's own, set for good at a context's first execution)
  POST /contexts           {language?, cwd?} -> {id, language, cwd}
  GET /contexts            -> [{id, language, cwd}]
  DELETE /contexts/ID      -> 204
  POST /contexts/ID/restart -> 204
  GET /health              -> 200 "OK"
"""

import json
import os
import select
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from queue import Empty

from jupyter_client.manager import KernelManager

PORT = int(os.environ.get("SNAPLAB_CI_PORT", "49999"))
DEFAULT_CWD = "/home/user" if os.path.isdir("/home/user") else "/root"
# a Jupyter MIME bundle's types, by the field names E2B's Result has
MIME = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


class Context:
    def __init__(self, cid, cwd):
        self.id = cid
        self.cwd = cwd
        self.lock = threading.Lock()
        # the sandbox's own variables (its create's envVars), set in the kernel at its first execution
        self.globals_set = False
        env = dict(os.environ)
        # plots as PNG display data, as in a notebook
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=cwd, env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def view(self):
        return {"id": self.id, "language": "python", "cwd": self.cwd}

    def restart(self):
        with self.lock:
            self.kc.stop_channels()
            self.km.restart_kernel(now=True)
            self.globals_set = False
            self.kc = self.km.client()
            self.kc.start_channels()
            self.kc.wait_for_ready(timeout=60)

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


contexts = {}
contexts_lock = threading.Lock()


def default_context():
    with contexts_lock:
        c = contexts.get("python")
        if c is None or not c.km.is_alive():
            c = Context("python", DEFAULT_CWD)
            contexts["python"] = c
        return c


def stamp():
    return datetime.now(timezone.utc).isoformat()


def result_line(content, main):
    line = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in content.get("data", {}).items():
        if mime in MIME:
            line[MIME[mime]] = value
        else:
            extra[mime] = value
    if extra:
        line["extra"] = extra
    return line


def line_of(msg):
    """The NDJSON line a kernel's iopub message becomes, or None."""
    kind = msg["msg_type"]
    c = msg["content"]
    if kind == "stream":
        return {"type": "stdout" if c["name"] == "stdout" else "stderr", "text": c["text"], "timestamp": stamp()}
    if kind == "execute_result":
        return result_line(c, True)
    if kind == "display_data":
        return result_line(c, False)
    if kind == "error":
        return {"type": "error", "name": c["ename"], "value": c["evalue"], "traceback": "\n".join(c["traceback"])}
    if kind == "execute_input":
        return {"type": "number_of_executions", "execution_count": c["execution_count"]}
    return None


def gone(sock):
    """The client closed its side (the SDK's timeout, or it went away)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


# the sandbox's variables (E2B's /envs: its create's envVars), set for good at a kernel's first execution
SET_GLOBALS = "__import__('os').environ.update({env!r})"
# runCode's envs: set in the kernel's environment for one execution, then put back as they were
SET_ENV = (
    "__import__('builtins').__dict__['_snaplab_env'] = "
    "{{k: __import__('os').environ.get(k) for k in {keys!r}}}; __import__('os').environ.update({env!r})"
)
RESET_ENV = (
    "[__import__('os').environ.pop(k, None) if v is None else __import__('os').environ.__setitem__(k, v) "
    "for k, v in __import__('builtins').__dict__.pop('_snaplab_env', {}).items()]"
)


def strings(d):
    """A JSON object of variables as str -> str (anything else: none); a name the environment cannot
    hold (empty, with '=' or NUL) or a value with NUL is left out, not let fail the others."""
    if not isinstance(d, dict):
        return {}
    out = {str(k): str(v) for k, v in d.items()}
    return {k: v for k, v in out.items() if k and "=" not in k and "\0" not in k and "\0" not in v}


def quiet(c, code):
    """Run code in the kernel unseen (no result, no count); its messages are skipped by msg_id."""
    return c.kc.execute(code, silent=True, store_history=False, allow_stdin=False, stop_on_error=False)


def wait_idle(c, msg_id, wait=10.0):
    """Wait (a while) for an execution's end."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            msg = c.kc.get_iopub_msg(timeout=0.5)
        except Empty:
            continue
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            return


def interrupt(c, msg_id, wait=10.0):
    """Interrupt an execution whose client went away, and wait (a while) for its end: the next one then runs at once."""
    c.km.interrupt_kernel()
    wait_idle(c, msg_id, wait)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # a body ends with its connection: NDJSON streams as it comes

    def log_message(self, fmt, *args):
        sys.stderr.write("code-interpreter: " + (fmt % args) + "\n")

    def answer(self, status, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw else {}

    def context(self, cid):
        if not cid:
            return default_context()
        with contexts_lock:
            return contexts.get(cid)

    @property
    def route(self):
        """The path without its query (the SDK adds ?source=... when E2B_USER_AGENT_SOURCE is set)."""
        return urllib.parse.urlsplit(self.path).path

    def do_GET(self):
        if self.route == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")
        elif self.route == "/contexts":
            default_context()
            with contexts_lock:
                self.answer(200, [c.view() for c in contexts.values()])
        else:
            self.answer(404, {"error": "no route " + self.route})

    def do_DELETE(self):
        cid = self.route[len("/contexts/"):] if self.route.startswith("/contexts/") else ""
        with contexts_lock:
            c = contexts.pop(cid, None) if cid else None
        if c is None:
            return self.answer(404, {"error": "no context " + cid})
        c.close()
        self.answer(204)

    def do_POST(self):
        try:
            m = self.body()
        except ValueError:
            return self.answer(400, {"error": "the body is not JSON"})
        if not isinstance(m, dict):
            return self.answer(400, {"error": "the body is not a JSON object"})
        if self.route == "/execute":
            return self.execute(m)
        if self.route == "/contexts":
            language = m.get("language") or "python"
            if language != "python":
                return self.answer(400, {"error": "only python contexts are served here"})
            c = Context(str(uuid.uuid4()), m.get("cwd") or DEFAULT_CWD)
            with contexts_lock:
                contexts[c.id] = c
            return self.answer(200, c.view())
        if self.route.startswith("/contexts/") and self.route.endswith("/restart"):
            c = self.context(self.route[len("/contexts/"):-len("/restart")])
            if c is None:
                return self.answer(404, {"error": "no such context"})
            c.restart()
            return self.answer(204)
        self.answer(404, {"error": "no route " + self.route})

    def send_line(self, line):
        self.wfile.write(json.dumps(line).encode() + b"\n")
        self.wfile.flush()

    def execute(self, m):
        language = m.get("language") or "python"
        if language != "python":
            return self.answer(400, {"error": "only python is served here"})
        c = self.context(m.get("context_id"))
        if c is None:
            return self.answer(404, {"error": "no context " + str(m.get("context_id"))})
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        env = strings(m.get("env_vars"))
        glob = strings(m.get("global_env_vars"))
        with c.lock:
            if glob and not c.globals_set:
                quiet(c, SET_GLOBALS.format(env=glob))
                c.globals_set = True
            if env:
                quiet(c, SET_ENV.format(keys=sorted(env), env=env))
            try:
                self.run(c, str(m.get("code", "")))
            finally:
                if env:
                    wait_idle(c, quiet(c, RESET_ENV))

    def run(self, c, code):
        # one execution at a time per context (its lock): an error need not abort what comes next
        msg_id = c.kc.execute(code, allow_stdin=False, stop_on_error=False)
        while True:
            if gone(self.connection):
                return interrupt(c, msg_id)
            if not c.km.is_alive():
                self.send_line({"type": "unexpected_end_of_execution"})
                return
            try:
                msg = c.kc.get_iopub_msg(timeout=0.5)
            except Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                self.send_line({"type": "end_of_execution"})
                return
            line = line_of(msg)
            if line is not None:
                try:
                    self.send_line(line)
                except OSError:
                    return interrupt(c, msg_id)


def main():
    threading.Thread(target=default_context, daemon=True).start()
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
