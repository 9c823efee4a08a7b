"""Sonic's runner of an OpenLambda handler as a DAG stage (docs/python.md).

Started by the agent as `python3 sonic_dag_runner.py <lambda-dir>` under the file ABI
(`SONIC_INPUT_DIR`, `SONIC_OUTPUT_DIR`, `SONIC_PARAMS`, ..., and `SONIC_HANDLER_ROUTES`), with
the `sonic` module on `PYTHONPATH`. It imports `<lambda-dir>/f.py`, calls `f(event)` once and
writes the returned value as the run's output files. Exit status 0 is success; on any failure
the last line it prints says why, starting with `sonic:`.
"""

import errno
import importlib.util
import os
import sys
import traceback


def fail(message):
    sys.stdout.flush()
    sys.stderr.write("sonic: %s\n" % message)
    sys.stderr.flush()
    sys.exit(1)


def over_quota(e):
    return isinstance(e, OSError) and e.errno in (errno.EFBIG, errno.EDQUOT, errno.ENOSPC)


def main():
    code_dir = os.path.abspath(sys.argv[1])
    import sonic

    sys.path.insert(0, code_dir)
    try:
        spec = importlib.util.spec_from_file_location("f", os.path.join(code_dir, "f.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["f"] = module
        spec.loader.exec_module(module)
        handler = module.f
    except BaseException:
        traceback.print_exc()
        fail("importing the handler's f.py failed (traceback above)")
    try:
        event = sonic.event()
    except BaseException:
        traceback.print_exc()
        fail("cannot read the inputs")
    try:
        value = handler(event)
    except BaseException as e:
        traceback.print_exc()
        if over_quota(e):
            fail("the handler wrote more than the run's output quota (%s)" % e)
        fail("the handler raised %s: %s" % (type(e).__name__, e))
    try:
        sonic.write_result(value)
    except sonic.OutputError as e:
        fail(str(e))
    except OSError as e:
        if over_quota(e):
            fail("the handler's result is larger than the run's output quota (%s)" % e)
        fail("cannot write the handler's result: %s" % e)


if __name__ == "__main__":
    main()
