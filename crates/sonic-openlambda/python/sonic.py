"""Sonic's file ABI for Python handlers in DAGs (docs/python.md).

A handler stage gets `event` (its parameters and its inputs, small JSON inputs inline) and
returns a JSON value, which Sonic writes as its output files. For large data it reads its input
files and writes output files itself with this module:

    import sonic

    def f(event):
        for i in sonic.inputs():                 # what this instance received
            data = i.read_bytes()
        with sonic.output("train", "data.bin") as out:   # a file for the receiver `train`
            out.write(data)
        return None                              # nothing more to write

Every data-passing method (vm-storage, direct, remote) then moves these files as it moves an
executable's.
"""

import json
import os
import re

# Input files up to this size that hold JSON are put in `event` as their parsed value.
INLINE_MAX = 1 << 20


class Input:
    """One input file: `path` (readable), `rel` (its path under the input folder, e.g.
    `gen/0/output.json`), `sender` (the sending function, or `input` for the job's input),
    `instance` (the sender's instance, None for the job's input), `name`, `size`."""

    def __init__(self, root, rel):
        self.rel = rel
        self.path = os.path.join(root, rel)
        parts = rel.split("/")
        self.sender = parts[0]
        if parts[0] != "input" and len(parts) >= 3 and parts[1].isdigit():
            self.instance = int(parts[1])
            self.name = "/".join(parts[2:])
        else:
            self.instance = None
            self.name = "/".join(parts[1:])
        self.size = os.path.getsize(self.path)

    def read_bytes(self):
        with open(self.path, "rb") as fh:
            return fh.read()

    def read_text(self, encoding="utf-8"):
        return self.read_bytes().decode(encoding)

    def json(self):
        return json.loads(self.read_bytes())

    def __repr__(self):
        return "Input(%r, %d bytes)" % (self.rel, self.size)


def input_dir():
    return os.environ["SONIC_INPUT_DIR"]


def output_dir():
    return os.environ["SONIC_OUTPUT_DIR"]


def params():
    """The job's parameters."""
    return json.loads(os.environ.get("SONIC_PARAMS") or "{}")


def instance():
    return int(os.environ.get("SONIC_INSTANCE", "0"))


def instances():
    return int(os.environ.get("SONIC_INSTANCES", "1"))


def routes():
    """Where this function's outputs go: receiver name (and `result` for a last function) ->
    edge kind (`one`, `broadcast`, `gather`, `scatter`, `shuffle`, `result`)."""
    return json.loads(os.environ.get("SONIC_HANDLER_ROUTES") or "{}")


def fanout(to):
    """The number of receivers of a `shuffle` edge to `to` (write `part-0` ... `part-<n-1>`)."""
    return int(os.environ["SONIC_FANOUT_" + to.upper().replace("-", "_")])


def inputs(sender=None):
    """Every input file, in path order (optionally only those from `sender`)."""
    root = input_dir()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if sender is None or rel.split("/")[0] == sender:
                found.append(Input(root, rel))
    found.sort(key=lambda i: i.rel)
    return found


_SAFE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


class _Output:
    """A file being written: visible under its name only once closed without an error."""

    def __init__(self, to, name, mode):
        if to != "result" and to not in routes():
            raise ValueError("%r is not a receiver of this function (routes: %s)" % (to, sorted(routes())))
        if not _SAFE.match(name) or any(p in ("", ".", "..") for p in name.split("/")) or name.startswith(".tmp"):
            raise ValueError("%r is not a valid output file name" % (name,))
        self.final = os.path.join(output_dir(), to, name)
        os.makedirs(os.path.dirname(self.final), exist_ok=True)
        self.tmp = os.path.join(os.path.dirname(self.final), ".tmp-" + os.path.basename(self.final))
        self.fh = open(self.tmp, mode)

    def __enter__(self):
        return self.fh

    def __exit__(self, kind, value, tb):
        self.fh.close()
        if kind is None:
            os.replace(self.tmp, self.final)
        else:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass
        return False


def output(to, name, mode="wb"):
    """A file `name` for the receiver `to` (or `result`), written atomically:
    `with sonic.output("reduce", "part.bin") as out: out.write(data)`."""
    return _Output(to, name, mode)


def write_bytes(to, name, data):
    with output(to, name, "wb") as out:
        out.write(data)


def write_json(to, name, value):
    data = json.dumps(value, allow_nan=False, separators=(",", ":")).encode("utf-8")
    write_bytes(to, name, data)


def _inline(path, size):
    if size > INLINE_MAX:
        return False, None
    try:
        with open(path, "rb") as fh:
            return True, json.loads(fh.read())
    except (ValueError, UnicodeDecodeError):
        return False, None


def event():
    """The `event` a handler stage is called with."""
    files = []
    for i in inputs():
        entry = {"path": i.path, "rel": i.rel, "sender": i.sender, "instance": i.instance,
                 "name": i.name, "size": i.size}
        ok, value = _inline(i.path, i.size)
        if ok:
            entry["value"] = value
        files.append(entry)
    return {
        "job_id": os.environ.get("SONIC_JOB_ID"),
        "function": os.environ.get("SONIC_FUNCTION"),
        "instance": instance(),
        "instances": instances(),
        "params": params(),
        "inputs": files,
    }


class OutputError(Exception):
    """The handler's return value cannot be written as the edge kinds ask."""


def write_result(value):
    """Writes what the handler returned on every route: `output.json` for one, broadcast, gather
    and result; one `part-NNNNNN.json` per element of a list for scatter; `part-<j>` per element
    of a list as long as the receiver's fanout for shuffle. None writes nothing."""
    if value is None:
        return
    try:
        whole = json.dumps(value, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise OutputError("the handler's result is not JSON-serializable: %s" % e)
    for to, kind in sorted(routes().items()):
        if kind == "scatter":
            if not isinstance(value, list):
                raise OutputError("the edge to %s is a scatter: return a list (one element per receiver), got %s" % (to, type(value).__name__))
            for j, part in enumerate(value):
                write_json(to, "part-%06d.json" % j, part)
        elif kind == "shuffle":
            n = fanout(to)
            if not isinstance(value, list) or len(value) != n:
                raise OutputError("the edge to %s is a shuffle to %d receivers: return a list of %d elements" % (to, n, n))
            for j, part in enumerate(value):
                write_json(to, "part-%d" % j, part)
        else:
            write_bytes(to, "output.json", whole)
