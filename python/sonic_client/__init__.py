"""Sonic's Python client: build DAGs, run jobs on a Sonic control plane, follow them, fetch
their results. Standard library only.

>>> import sonic_client as sonic
>>> client = sonic.Client()   # doctest: +SKIP
>>> img = "sonic-lambdas:latest"
>>> dag = (sonic.Dag("copy")
...        .function("gen", image=img, command=["synthetic", "copy", "--to", "sink"])
...        .function("sink", image=img, command=["synthetic", "copy", "--to", "result"])
...        .edge("gen", "sink", "one"))
>>> client.apply(dag)                                         # doctest: +SKIP
>>> summary = client.run(dag, input=b"hello", key="copy-1")   # doctest: +SKIP
>>> summary["status"]                                         # doctest: +SKIP
'succeeded'
>>> client.fetch(summary["job_id"], "out/")                   # doctest: +SKIP
>>> job = client.submit(dag, input=b"hello")                  # doctest: +SKIP
>>> job.wait(progress=print).latency_s                        # doctest: +SKIP

The manual is docs/python-client.md in Sonic's repository.
"""

from .client import Client, Input, Job, PathArg, Progress, Result, config_path
from .dag import Dag, Duration, EdgeKind, duration, param_ref
from .errors import SonicError
from .types import (
    TERMINAL,
    DagDetail,
    DagInfo,
    EdgeRun,
    FetchedFile,
    FunctionRun,
    InstanceLog,
    JobEvent,
    JobSummary,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Dag",
    "DagDetail",
    "DagInfo",
    "Duration",
    "EdgeKind",
    "EdgeRun",
    "FetchedFile",
    "FunctionRun",
    "Input",
    "InstanceLog",
    "Job",
    "JobEvent",
    "JobSummary",
    "PathArg",
    "Progress",
    "Result",
    "SonicError",
    "TERMINAL",
    "config_path",
    "duration",
    "param_ref",
]
