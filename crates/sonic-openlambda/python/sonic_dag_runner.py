"""Sonic's runner of an OpenLambda handler as a DAG stage (docs/python.md).

Started by the agent as `python3 sonic_dag_runner.py <lambda-dir>` under the file ABI
(`SONIC_INPUT_DIR`, `SONIC_OUTPUT_DIR`, `SONIC_PARAMS`, ..., and `SONIC_HANDLER_ROUTES`), with
the `sonic` module on `PYTHONPATH`. The handler is called once per run, and its returned value is
written as the run's output files. Exit status 0 is success; on any failure the last line it
prints says why, starting with `sonic:`.

Warm runtime: the imported module lives as long as the warm instance (the sandbox's warm
environment or container), not as long as one run. The first run of an instance starts a
runtime process (a daemon in a session of its own, listening on a unix socket in the instance's
private `TMPDIR`, `.sonic-python-runtime`), which imports `f.py` once; every run, this one
included, is a client that hands the runtime its call: its environment, working directory, file
size limit and its standard output and error (passed as file descriptors, so the handler's
prints are the run's log). The runtime calls `f(event)`, writes the result into the run's output
folder and answers with the status. A client that dies during the call (its timeout, its output
quota) takes the runtime with it: the next run starts a new one and imports again. The runtime
ends when its socket goes (the sandbox removed the environment after its keep-alive) or, in the
process sandbox, when the agent (`SONIC_AGENT_PID`) is gone; in the Docker sandbox it ends with
its container. A prewarm (`SONIC_PREWARM=1`, sent by the agent ahead of a stage's runs) only
starts the runtime, which imports `f.py`: the handler is not called. In the process sandbox
with memory cgroups, the client moves the runtime into
its run's memory group (`SONIC_MEMORY_CGROUP`) for the call and back to the parent group after
it, so every call is bounded and measured by its run's group.
"""

import errno
import importlib.util
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import threading
import traceback

SOCKET_NAME = ".sonic-python-runtime"
# The run's peak memory as the runtime measured it (read and removed by the agent).
USAGE_FILE = ".sonic-handler-usage.json"


class Failure(Exception):
    """A run failed; the message is its last line (after `sonic: `)."""


def over_quota(e):
    return isinstance(e, OSError) and e.errno in (errno.EFBIG, errno.EDQUOT, errno.ENOSPC)


def import_handler(code_dir):
    sys.path.insert(0, code_dir)
    try:
        spec = importlib.util.spec_from_file_location("f", os.path.join(code_dir, "f.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["f"] = module
        spec.loader.exec_module(module)
        return module.f
    except BaseException:
        traceback.print_exc()
        raise Failure("importing the handler's f.py failed (traceback above)")


def call(handler):
    """One call of the handler under the current environment: reads the inputs, calls it,
    writes what it returned. Raises Failure."""
    import sonic

    try:
        event = sonic.event()
    except BaseException:
        traceback.print_exc()
        raise Failure("cannot read the inputs")
    try:
        value = handler(event)
    except BaseException as e:
        traceback.print_exc()
        if over_quota(e):
            raise Failure("the handler wrote more than the run's output quota (%s)" % e)
        raise Failure("the handler raised %s: %s" % (type(e).__name__, e))
    try:
        sonic.write_result(value)
    except sonic.OutputError as e:
        raise Failure(str(e))
    except OSError as e:
        if over_quota(e):
            raise Failure("the handler's result is larger than the run's output quota (%s)" % e)
        raise Failure("cannot write the handler's result: %s" % e)


def fail(message):
    sys.stdout.flush()
    sys.stderr.write("sonic: %s\n" % message)
    sys.stderr.flush()
    sys.exit(1)


def prewarm():
    """A prewarm run (`SONIC_PREWARM=1`, sent by the agent ahead of a stage's runs): the
    instance's runtime is started and imports `f.py`; the handler is not called."""
    return os.environ.get("SONIC_PREWARM") == "1"


def run_once(code_dir):
    """The run imports and calls the handler itself (no runtime could be started)."""
    try:
        handler = import_handler(code_dir)
        if not prewarm():
            call(handler)
    except Failure as e:
        fail(str(e))


# --- the wire: a 4-byte big-endian length, then that many bytes of JSON ---------------------


def send_msg(sock, obj, fds=()):
    data = json.dumps(obj).encode("utf-8")
    data = struct.pack(">I", len(data)) + data
    if fds:
        socket.send_fds(sock, [data[:1]], list(fds))
        data = data[1:]
    sock.sendall(data)


def recv_exact(sock, n, head=b""):
    buf = bytearray(head)
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_msg(sock, with_fds=0):
    fds = []
    head = b""
    if with_fds:
        head, fds, _, _ = socket.recv_fds(sock, 1, with_fds)
        if not head:
            return None, fds
    size = recv_exact(sock, 4, head)
    if size is None:
        return None, fds
    body = recv_exact(sock, struct.unpack(">I", size)[0])
    if body is None:
        return None, fds
    return json.loads(body), fds


def in_dir(path, fn):
    """Runs `fn` with `path` as the working directory (a socket's path may exceed the 108 bytes
    of a unix address; its name relative to its folder does not)."""
    here = os.open(".", os.O_RDONLY)
    try:
        os.chdir(path)
        return fn()
    finally:
        os.fchdir(here)
        os.close(here)


# --- the runtime ------------------------------------------------------------------------------


def still_wanted(folder, ident, owner):
    try:
        st = os.stat(os.path.join(folder, SOCKET_NAME))
    except OSError:
        return False
    if (st.st_dev, st.st_ino) != ident:
        return False
    if owner:
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            return False
        except OSError:
            pass
    return True


def peak_kib():
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def watch(conn, replied):
    """Ends the runtime when its client goes before the answer (killed: timeout, quota)."""
    p = select.poll()
    p.register(conn.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        try:
            p.poll()
            break
        except InterruptedError:
            continue
    if not replied.is_set():
        os._exit(1)


def serve(listener, folder, ident, code_dir, owner):
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    listener.settimeout(1.0)
    handler = None
    while True:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            if not still_wanted(folder, ident, owner):
                os._exit(0)
            continue
        conn.setblocking(True)
        try:
            send_msg(conn, {"pid": os.getpid()})
            req, fds = recv_msg(conn, 2)
        except (OSError, ValueError):
            # The client went before it handed its run over: nothing ran.
            conn.close()
            continue
        if req is None or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        if req["code_dir"] != code_dir or req["executable"] != sys.executable:
            # Not this runtime's function (cannot happen within one warm key): let the client
            # start its own.
            for fd in fds:
                os.close(fd)
            send_msg(conn, {"mismatch": True})
            conn.close()
            os._exit(0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        try:
            os.chdir(req["cwd"])
        except OSError:
            pass
        try:
            resource.setrlimit(resource.RLIMIT_FSIZE, tuple(req["fsize"]))
        except (OSError, ValueError):
            pass
        replied = threading.Event()
        watcher = threading.Thread(target=watch, args=(conn, replied), daemon=True)
        watcher.start()
        reset_peak()
        status = {"status": 0}
        end = False
        try:
            if handler is None:
                try:
                    handler = import_handler(code_dir)
                except Failure as e:
                    status = {"status": 1, "message": str(e)}
                    end = True
            if handler is not None and not req.get("prewarm"):
                call(handler)
        except Failure as e:
            status = {"status": 1, "message": str(e)}
        except BaseException as e:
            # SystemExit or KeyboardInterrupt from the handler's own code: the runtime ends.
            traceback.print_exc()
            status = {"status": 1, "message": "the handler raised %s: %s" % (type(e).__name__, e)}
            end = True
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        status["peak_kib"] = peak_kib()
        os.dup2(null, 1)
        os.dup2(null, 2)
        replied.set()
        try:
            send_msg(conn, status)
            conn.recv(1)
        except OSError:
            pass
        conn.close()
        watcher.join()
        if end:
            os._exit(0)


# Whether this run started its instance's runtime (a cold start of the runtime, reported to
# the agent in USAGE_FILE even when the instance itself was warm).
STARTED = False


def start_runtime(folder, code_dir):
    """Starts this instance's runtime (a daemon): the listening socket is made here, before the
    fork, so that the client can connect as soon as this returns."""
    global STARTED
    STARTED = True
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def bind():
        try:
            os.unlink(SOCKET_NAME)
        except FileNotFoundError:
            pass
        listener.bind(SOCKET_NAME)

    in_dir(folder, bind)
    listener.listen(4)
    st = os.stat(os.path.join(folder, SOCKET_NAME))
    owner = int(os.environ.get("SONIC_AGENT_PID") or "0")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                serve(listener, folder, (st.st_dev, st.st_ino), code_dir, owner)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    listener.close()


def connect(folder):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        in_dir(folder, lambda: sock.connect(SOCKET_NAME))
    except OSError:
        sock.close()
        return None
    return sock


def move_to_cgroup(group, pid):
    with open(os.path.join(group, "cgroup.procs"), "w") as fh:
        fh.write(str(pid))


def client(code_dir, retry=True):
    """Hands the call to the instance's runtime, starting one when there is none (at most one
    new start per run; without a runtime the run imports and calls the handler itself)."""
    folder = os.environ.get("TMPDIR") or "/tmp"
    sock = connect(folder)
    if sock is None:
        if not retry:
            return run_once(code_dir)
        try:
            start_runtime(folder, code_dir)
        except OSError as e:
            sys.stderr.write("sonic: no warm runtime (%s): this run imports the handler itself\n" % e)
            return run_once(code_dir)
        return client(code_dir, False)
    hello, _ = recv_msg(sock)
    if hello is None:
        # The runtime was ending (its socket was removed, or its client died): start a new one.
        sock.close()
        return fresh(code_dir, folder, retry)
    pid = hello["pid"]
    group = os.environ.get("SONIC_MEMORY_CGROUP")
    if group:
        try:
            move_to_cgroup(group, pid)
        except OSError as e:
            sys.stderr.write("sonic: cannot move the runtime into the run's memory group: %s\n" % e)
            os.kill(pid, signal.SIGKILL)
            sock.close()
            return run_once(code_dir)
    req = {
        "code_dir": code_dir,
        "executable": sys.executable,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "fsize": list(resource.getrlimit(resource.RLIMIT_FSIZE)),
        "prewarm": prewarm(),
    }
    sys.stdout.flush()
    sys.stderr.flush()
    send_msg(sock, req, fds=(1, 2))
    reply, _ = recv_msg(sock)
    if group and reply is not None:
        try:
            move_to_cgroup(os.path.dirname(group.rstrip("/")), pid)
        except OSError as e:
            sys.stderr.write("sonic: cannot move the runtime out of the run's memory group (%s): it ends\n" % e)
            os.kill(pid, signal.SIGKILL)
    sock.close()
    if reply is None:
        fail("the handler's runtime ended during the call (killed, or the handler exited it)")
    if reply.get("mismatch"):
        return fresh(code_dir, folder, retry)
    try:
        out = os.environ.get("SONIC_OUTPUT_DIR")
        if out and (reply.get("peak_kib") or STARTED):
            with open(os.path.join(out, USAGE_FILE), "w") as fh:
                json.dump({"peak_kib": reply.get("peak_kib"), "runtime_started": STARTED}, fh)
    except OSError:
        pass
    if reply.get("status") != 0:
        fail(reply.get("message") or "the handler failed")


def fresh(code_dir, folder, retry):
    """Starts a new runtime (once per run) and hands it the call."""
    if not retry:
        return run_once(code_dir)
    try:
        start_runtime(folder, code_dir)
    except OSError:
        return run_once(code_dir)
    return client(code_dir, False)


def main():
    client(os.path.abspath(sys.argv[1]))


if __name__ == "__main__":
    main()
