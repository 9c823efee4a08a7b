"""Sonic's Python runtime for OpenLambda handlers: one warm process per lambda.

Started as `python3 sonic_ol_runtime.py <lambda-dir>`. It imports the lambda's entry file once
(`OL_ENTRY_FILE`, default `f.py`) and finds its entry as OpenLambda's worker does:
`OL_WSGI_ENTRY` or `OL_ASGI_ENTRY` names an app; else `f(event)`; else `app`, an ASGI app when it
is a coroutine function (or its `__call__` is), else a WSGI app. It says
{"ready": true, "entry": "func" | "wsgi" | "asgi"}, then answers one JSON line per request on
its original stdout:

- a function: {"event": ...} -> {"ok": result} or {"err": traceback};
- an app: {"http": {"method", "app", "path", "query", "headers": [[name, value], ...],
  "body": base64}} -> {"http": {"status": int, "headers": [[name, value], ...],
  "body": base64}} or {"err": traceback} when it failed before it answered.

The handler's own prints go to stderr, so they never mix with the protocol.
"""

import asyncio
import base64
import importlib.util
import inspect
import io
import json
import os
import sys
import traceback


def entry_of(module):
    """(kind, callable) of the imported module, as OpenLambda's runtime chooses it."""
    wsgi = os.environ.get("OL_WSGI_ENTRY")
    asgi = os.environ.get("OL_ASGI_ENTRY")
    if wsgi:
        return "wsgi", getattr(module, wsgi)
    if asgi:
        return "asgi", getattr(module, asgi)
    if hasattr(module, "f"):
        return "func", module.f
    if hasattr(module, "app"):
        app = module.app
        is_async = inspect.iscoroutinefunction(app) or inspect.iscoroutinefunction(
            getattr(app, "__call__", None)
        )
        return ("asgi" if is_async else "wsgi"), app
    raise ValueError("no entry point: define `f` or `app` in the entry file")


def call_wsgi(app, req):
    """Runs a WSGI app (PEP 3333) on one request: (status, headers, body)."""
    body = base64.b64decode(req.get("body") or "")
    headers = req.get("headers") or []
    host = next((v for k, v in headers if k.lower() == "host"), "localhost")
    server_name, _, server_port = host.partition(":")
    environ = {
        "REQUEST_METHOD": req["method"],
        "SCRIPT_NAME": "/run/" + req["app"],
        "PATH_INFO": req.get("path") or "/",
        "QUERY_STRING": req.get("query") or "",
        "SERVER_NAME": server_name,
        "SERVER_PORT": server_port,
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in headers:
        key = name.upper().replace("-", "_")
        if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            environ[key] = value
        else:
            environ["HTTP_" + key] = value
    environ.setdefault("CONTENT_LENGTH", str(len(body)))
    started = {}
    chunks = []

    def start_response(status, response_headers, exc_info=None):
        if exc_info and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started["status"] = int(str(status).split(None, 1)[0])
        started["headers"] = [[str(k), str(v)] for k, v in response_headers]
        return chunks.append

    result = app(environ, start_response)
    try:
        for chunk in result:
            chunks.append(chunk)
    finally:
        if hasattr(result, "close"):
            result.close()
    if "status" not in started:
        raise RuntimeError("the WSGI app never called start_response")
    return started["status"], started["headers"], b"".join(chunks)


def call_asgi(loop, app, req):
    """Runs an ASGI app (HTTP scope, ASGI 3) on one request: (status, headers, body)."""
    body = base64.b64decode(req.get("body") or "")
    headers = req.get("headers") or []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": req["method"],
        "scheme": "http",
        "path": req.get("path") or "/",
        "raw_path": (req.get("path") or "/").encode(),
        "query_string": (req.get("query") or "").encode(),
        "root_path": "/run/" + req["app"],
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        "client": None,
        "server": None,
    }
    sent = {"body": False}
    response = {"status": None, "headers": [], "chunks": []}

    async def receive():
        if not sent["body"]:
            sent["body"] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            response["status"] = int(message["status"])
            response["headers"] = [
                [k.decode("latin-1"), v.decode("latin-1")] for k, v in message.get("headers", [])
            ]
        elif message["type"] == "http.response.body":
            response["chunks"].append(bytes(message.get("body", b"")))

    loop.run_until_complete(app(scope, receive, send))
    if response["status"] is None:
        raise RuntimeError("the ASGI app never started a response")
    return response["status"], response["headers"], b"".join(response["chunks"])


def main():
    code_dir = os.path.abspath(sys.argv[1])
    # The protocol keeps private copies of stdin/stdout; the handler sees /dev/null and stderr.
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull, "r")
    sys.stdout = sys.stderr

    def reply(obj):
        proto_out.write(json.dumps(obj).encode("utf-8") + b"\n")
        proto_out.flush()

    # The worker's memory bound (SONIC_WORKER_MEMORY bytes of address space, soft and hard, so
    # the handler cannot raise it): past it an allocation raises MemoryError in the handler.
    limit = os.environ.pop("SONIC_WORKER_MEMORY", "")
    if limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))

    sys.path.insert(0, code_dir)
    try:
        entry_file = os.environ.get("OL_ENTRY_FILE", "f.py")
        if not entry_file.endswith(".py") or "/" in entry_file:
            raise ValueError(f"OL_ENTRY_FILE must name a .py file at the top, not {entry_file!r}")
        module_name = entry_file[:-3]
        spec = importlib.util.spec_from_file_location(
            module_name, os.path.join(code_dir, entry_file)
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        kind, entry = entry_of(module)
    except BaseException:
        reply({"import_error": traceback.format_exc()})
        return
    loop = asyncio.new_event_loop() if kind == "asgi" else None
    reply({"ready": True, "entry": kind})

    while True:
        line = proto_in.readline()
        if not line:
            return
        try:
            call = json.loads(line)
            if "http" in call:
                req = call["http"]
                if kind == "asgi":
                    status, headers, body = call_asgi(loop, entry, req)
                else:
                    status, headers, body = call_wsgi(entry, req)
                answer = {
                    "http": {
                        "status": status,
                        "headers": headers,
                        "body": base64.b64encode(body).decode("ascii"),
                    }
                }
            else:
                answer = {"ok": entry(call["event"])}
            result = json.dumps(answer)
        except BaseException:
            result = json.dumps({"err": traceback.format_exc()})
        proto_out.write(result.encode("utf-8") + b"\n")
        proto_out.flush()


if __name__ == "__main__":
    main()
