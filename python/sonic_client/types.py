"""What the control plane answers, as typed records.

Each record has the fields this client knows and ``raw``: the JSON document exactly as the server
sent it, fields added by newer control planes included (docs/api.md documents every one).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional

#: The statuses a job ends in.
TERMINAL = frozenset({"succeeded", "failed"})


def _f(doc: Dict[str, Any], k: str, default: float = 0.0) -> float:
    v = doc.get(k)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def _i(doc: Dict[str, Any], k: str, default: int = 0) -> int:
    v = doc.get(k)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else default


def _s(doc: Dict[str, Any], k: str, default: str = "") -> str:
    v = doc.get(k)
    return v if isinstance(v, str) else default


def _os(doc: Dict[str, Any], k: str) -> Optional[str]:
    v = doc.get(k)
    return v if isinstance(v, str) else None


def _of(doc: Dict[str, Any], k: str) -> Optional[float]:
    v = doc.get(k)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _oi(doc: Dict[str, Any], k: str) -> Optional[int]:
    v = doc.get(k)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _list(doc: Dict[str, Any], k: str) -> List[Any]:
    v = doc.get(k)
    return v if isinstance(v, list) else []


@dataclass
class EdgeRun:
    """How one edge's data moved in a finished job."""

    from_: str
    to: str
    #: ``vm-storage``, ``direct``, ``remote`` or ``memory``.
    method: str
    bytes: int
    seconds: float
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "EdgeRun":
        return cls(
            from_=_s(doc, "from"),
            to=_s(doc, "to"),
            method=_s(doc, "method"),
            bytes=_i(doc, "bytes"),
            seconds=_f(doc, "seconds"),
            raw=doc,
        )


@dataclass
class FunctionRun:
    """How one function instance ran in a finished job."""

    name: str
    instance: int
    agent: str
    vm_type: str
    cold: bool
    seconds: float
    attempts: int
    peak_memory_mb: Optional[float] = None
    start_latency_s: Optional[float] = None
    #: When the instance's first attempt was sent and its report came back, seconds since the
    #: job started.
    started_s: Optional[float] = None
    ended_s: Optional[float] = None
    #: The CPUs the instance was given (its plan's ``cores``).
    cpus: Optional[float] = None
    #: A retried job's instance that had succeeded before the retry: not run again, its outputs
    #: reused (its times are those of its earlier run).
    reused: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "FunctionRun":
        return cls(
            name=_s(doc, "name"),
            instance=_i(doc, "instance"),
            agent=_s(doc, "agent"),
            vm_type=_s(doc, "vm_type"),
            cold=bool(doc.get("cold", False)),
            seconds=_f(doc, "seconds"),
            attempts=_i(doc, "attempts"),
            peak_memory_mb=_of(doc, "peak_memory_mb"),
            start_latency_s=_of(doc, "start_latency_s"),
            started_s=_of(doc, "started_s"),
            ended_s=_of(doc, "ended_s"),
            cpus=_of(doc, "cpus"),
            reused=bool(doc.get("reused", False)),
            raw=doc,
        )


@dataclass
class JobSummary:
    """A job as ``GET /v1/jobs/{id}`` shows it: its state, and once it ended what it measured.

    ``latency_s``, ``cost_usd`` and ``perf_per_dollar`` are 0 until the job ended. ``plan`` (a
    planned job's plan, placement and notes) and ``slo`` are kept as the server's JSON.
    """

    job_id: str
    dag: str
    #: ``queued``, ``running``, ``succeeded`` or ``failed``.
    status: str
    #: ``remote``, ``direct``, ``local``, ``sonic``, ... (how its edges were chosen).
    policy: str
    #: ``profiling`` or ``planned``.
    mode: str
    input_bytes: int
    latency_s: float
    cost_usd: float
    perf_per_dollar: float
    storage_usd: float = 0.0
    requests_usd: float = 0.0
    edges: List[EdgeRun] = field(default_factory=list)
    functions: List[FunctionRun] = field(default_factory=list)
    #: The results, ``store://jobs/<id>/result/<path>`` (see :meth:`sonic.Client.results`).
    outputs: List[str] = field(default_factory=list)
    error: Optional[str] = None
    #: Why a run failed the job: ``exit``, ``timeout``, ``out_of_memory``, ``cancelled``, ...
    failure: Optional[str] = None
    mode_reason: Optional[str] = None
    plan: Optional[Dict[str, Any]] = None
    slo: Optional[Dict[str, Any]] = None
    #: When it was submitted, started and ended: milliseconds since the Unix epoch (absent
    #: until it did).
    submitted_ms: Optional[int] = None
    started_ms: Optional[int] = None
    ended_ms: Optional[int] = None
    #: The DAG's bounds the job missed, in words (it succeeded, but not within them).
    bounds_missed: List[str] = field(default_factory=list)
    #: The revision of its DAG the job runs (kept through resume and retry).
    dag_revision: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def methods(self) -> Dict[str, str]:
        """Each edge's data-passing method, by ``"from->to"``."""
        return {f"{e.from_}->{e.to}": e.method for e in self.edges}

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "JobSummary":
        plan = doc.get("plan")
        slo = doc.get("slo")
        return cls(
            job_id=_s(doc, "job_id"),
            dag=_s(doc, "dag"),
            status=_s(doc, "status"),
            policy=_s(doc, "policy"),
            mode=_s(doc, "mode"),
            input_bytes=_i(doc, "input_bytes"),
            latency_s=_f(doc, "latency_s"),
            cost_usd=_f(doc, "cost_usd"),
            perf_per_dollar=_f(doc, "perf_per_dollar"),
            storage_usd=_f(doc, "storage_usd"),
            requests_usd=_f(doc, "requests_usd"),
            edges=[EdgeRun.from_json(e) for e in _list(doc, "edges") if isinstance(e, dict)],
            functions=[
                FunctionRun.from_json(f) for f in _list(doc, "functions") if isinstance(f, dict)
            ],
            outputs=[o for o in _list(doc, "outputs") if isinstance(o, str)],
            error=_os(doc, "error"),
            failure=_os(doc, "failure"),
            mode_reason=_os(doc, "mode_reason"),
            plan=plan if isinstance(plan, dict) else None,
            slo=slo if isinstance(slo, dict) else None,
            submitted_ms=_oi(doc, "submitted_ms"),
            started_ms=_oi(doc, "started_ms"),
            ended_ms=_oi(doc, "ended_ms"),
            bounds_missed=[b for b in _list(doc, "bounds_missed") if isinstance(b, str)],
            dag_revision=_oi(doc, "dag_revision"),
            raw=doc,
        )


@dataclass
class JobEvent:
    """One step of a job's progress (``GET /v1/jobs/{id}/events``), as a callback gets it."""

    job_id: str
    status: str
    #: The stage running, when one is.
    stage: Optional[str]
    done_instances: int
    total_instances: int
    #: Why it waits, when it does (``queued behind 2 earlier requests for resources``).
    message: Optional[str]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "JobEvent":
        return cls(
            job_id=_s(doc, "job_id"),
            status=_s(doc, "status"),
            stage=_os(doc, "stage"),
            done_instances=_i(doc, "done_instances"),
            total_instances=_i(doc, "total_instances"),
            message=_os(doc, "message"),
            raw=doc,
        )


@dataclass
class DagInfo:
    """A registered DAG (``GET /v1/dags``; ``client.apply``'s answer)."""

    name: str
    description: str
    #: Its functions, in topological order.
    functions: List[str]
    #: How many edges it has.
    edges: int
    #: Grows by one each time a different file is applied under its name.
    revision: int
    triggers: List[str]
    created_at_ms: int
    updated_at_ms: int
    #: From ``client.apply``: True when the DAG is new, False when it replaced one (or was the
    #: same text); None elsewhere.
    created: Optional[bool] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any], created: Optional[bool] = None) -> "DagInfo":
        return cls(
            name=_s(doc, "name"),
            description=_s(doc, "description"),
            functions=[f for f in _list(doc, "functions") if isinstance(f, str)],
            edges=_i(doc, "edges"),
            revision=_i(doc, "revision"),
            triggers=[t for t in _list(doc, "triggers") if isinstance(t, str)],
            created_at_ms=_i(doc, "created_at_ms"),
            updated_at_ms=_i(doc, "updated_at_ms"),
            created=created,
            raw=doc,
        )


@dataclass
class DagDetail(DagInfo):
    """One DAG (``GET /v1/dags/{name}``): its summary, the file as applied and the checked DAG."""

    yaml: str = ""
    #: The checked DAG: functions in topological order with ``timeout_s`` and ``instances``,
    #: edges by function index, ``params``, ``bounds``.
    parsed: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any], created: Optional[bool] = None) -> "DagDetail":
        base = DagInfo.from_json(doc, created)
        parsed = doc.get("parsed")
        return cls(
            **{f.name: getattr(base, f.name) for f in fields(DagInfo)},
            yaml=_s(doc, "yaml"),
            parsed=parsed if isinstance(parsed, dict) else {},
        )


@dataclass
class InstanceLog:
    """What one instance attempt wrote (the tail of its standard output and error)."""

    function: str
    instance: int
    attempt: int
    agent: str
    log: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "InstanceLog":
        return cls(
            function=_s(doc, "function"),
            instance=_i(doc, "instance"),
            attempt=_i(doc, "attempt"),
            agent=_s(doc, "agent"),
            log=_s(doc, "log"),
            raw=doc,
        )


@dataclass
class FetchedFile:
    """One result written by :meth:`sonic.Client.fetch`."""

    #: The job's output it is (``store://jobs/<id>/result/sink/0/out``).
    output: str
    #: Its path under the job's ``result/`` (``sink/0/out``).
    key: str
    #: Where it was written.
    path: str
    bytes: int
