"""Sonic's Python runtime for OpenLambda handlers: one warm process per lambda.

Started as `python3 sonic_ol_runtime.py <lambda-dir>`. It imports `<lambda-dir>/f.py` once, then
answers one JSON line per request on its original stdout: {"event": ...} -> {"ok": result} or
{"err": traceback}. The handler's own prints go to stderr, so they never mix with the protocol.
"""

import importlib.util
import json
import os
import sys
import traceback


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
        spec = importlib.util.spec_from_file_location("f", os.path.join(code_dir, "f.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["f"] = module
        spec.loader.exec_module(module)
        handler = module.f
    except BaseException:
        reply({"import_error": traceback.format_exc()})
        return
    reply({"ready": True})

    while True:
        line = proto_in.readline()
        if not line:
            return
        try:
            event = json.loads(line)["event"]
            result = json.dumps({"ok": handler(event)})
        except BaseException:
            result = json.dumps({"err": traceback.format_exc()})
        proto_out.write(result.encode("utf-8") + b"\n")
        proto_out.flush()


if __name__ == "__main__":
    main()
