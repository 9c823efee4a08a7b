"""The control plane's HTTP API (docs/api.md) from Python, with the standard library alone."""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Generator,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    Union,
)

from .dag import Dag
from .errors import SonicError
from .types import (
    DagDetail,
    DagInfo,
    FetchedFile,
    InstanceLog,
    JobEvent,
    JobSummary,
)

__all__ = ["Client", "Job", "Result", "Progress", "config_path", "Input", "PathArg"]

_VERSION = "0.1.0"

#: What a job's input may be: a file's path, or its bytes.
Input = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview]
#: A file's path.
PathArg = Union[str, "os.PathLike[str]"]

#: A progress callback: called with each :class:`~sonic_client.JobEvent` while a job is followed.
Progress = Callable[[JobEvent], None]

# The event stream sends a keep-alive comment every 15 s: a longer silence is a broken stream.
_EVENT_READ_TIMEOUT = 40.0
_CHUNK = 1 << 20


def config_path() -> Path:
    """Where ``ofctl up`` saves the control plane it started:
    ``$XDG_CONFIG_HOME/sonic/config.json``, else ``~/.config/sonic/config.json``
    (``{"server": ..., "token": ..., "ca_file": ...}``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    if base:
        return Path(base) / "sonic" / "config.json"
    home = os.environ.get("HOME") or ""
    if not home:
        raise SonicError(None, "HOME is not set: set XDG_CONFIG_HOME or HOME")
    return Path(home) / ".config" / "sonic" / "config.json"


def _saved() -> Optional[Dict[str, Any]]:
    path = config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SonicError(None, f"cannot read {path}: {e}") from e
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise SonicError(None, f"{path}: not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise SonicError(None, f"{path}: not a JSON object")
    return doc


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def _input_name(path: str) -> str:
    """A name the control plane takes under ``input/``: letters, digits, ``.``, ``_``, ``-``."""
    raw = os.path.basename(path)
    clean = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in raw)
    clean = clean[:128].lstrip(".")
    return clean or "input"


def _result_key(job_id: str, output: str) -> str:
    """An output's path under its job's ``result/``: ``store://jobs/<id>/result/a/b`` gives
    ``a/b``. Refuses anything that could leave the folder it is fetched into."""
    if output.startswith("s3://"):
        rest = output[len("s3://") :]
        key = rest.split("/", 1)[1] if "/" in rest else ""
    elif output.startswith("store://"):
        key = output[len("store://") :]
    else:
        key = output
    prefix = f"jobs/{job_id}/result/"
    if not key.startswith(prefix):
        raise SonicError(None, f"output {output} is not under {prefix}")
    rel = key[len(prefix) :]
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") or "\\" in p for p in parts):
        raise SonicError(None, f"output {output} has an unsafe path")
    return rel


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The control plane never redirects; following one would send the token elsewhere."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


class Client:
    """A client of one control plane.

    ``server`` (``http://127.0.0.1:7000``) defaults to ``$SONIC_SERVER``, else the server
    ``ofctl up`` saved (:func:`config_path`); ``token`` to ``$SONIC_TOKEN``, else the saved
    token; ``ca_file`` (the CA an ``https://`` server's certificate is checked against) to
    ``$SONIC_CA_FILE``, else the saved one, else the system's roots. ``timeout`` bounds each
    request's connect and reads, in seconds.

    Every refusal raises :class:`~sonic_client.SonicError` with the HTTP status and the server's
    message.
    """

    def __init__(
        self,
        server: Optional[str] = None,
        token: Optional[str] = None,
        *,
        ca_file: Optional[PathArg] = None,
        timeout: float = 30.0,
    ) -> None:
        env_server = os.environ.get("SONIC_SERVER") or None
        env_token = os.environ.get("SONIC_TOKEN") or None
        env_ca = os.environ.get("SONIC_CA_FILE") or None
        saved = None
        if (server is None and env_server is None) or (token is None and env_token is None):
            saved = _saved()
        server = server or env_server or (saved or {}).get("server")
        if not isinstance(server, str) or not server:
            raise SonicError(
                None,
                "no control plane known: start one with `ofctl up`, or pass server= "
                "(or set SONIC_SERVER)",
            )
        if not re.match(r"^https?://[^/]", server):
            raise ValueError(f"server is an http:// or https:// URL, not {server!r}")
        token = token or env_token or (saved or {}).get("token")
        ca = ca_file or env_ca or (saved or {}).get("ca_file")
        self.server: str = server.rstrip("/")
        self._token: Optional[str] = token if isinstance(token, str) and token else None
        self.timeout = timeout
        handlers: List[urllib.request.BaseHandler] = [_NoRedirect()]
        if self.server.startswith("https://"):
            ctx = ssl.create_default_context(cafile=os.fspath(ca) if ca else None)
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        self._opener = urllib.request.build_opener(*handlers)

    def __repr__(self) -> str:
        return f"Client(server={self.server!r})"

    # ---- HTTP ----

    def _open(
        self,
        method: str,
        path: str,
        *,
        data: Optional[bytes] = None,
        content_type: Optional[str] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> http.client.HTTPResponse:
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("User-Agent", f"sonic-client/{_VERSION}")
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        if content_type:
            req.add_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        route = path.split("?", 1)[0]
        try:
            resp = self._opener.open(req, timeout=self.timeout if timeout is None else timeout)
        except urllib.error.HTTPError as e:
            raise self._refusal(e, method, route) from None
        except urllib.error.URLError as e:
            raise SonicError(
                None,
                f"cannot reach the control plane at {self.server}: {e.reason}",
                method=method,
                path=route,
            ) from None
        except (OSError, http.client.HTTPException) as e:
            raise SonicError(
                None,
                f"cannot reach the control plane at {self.server}: {e}",
                method=method,
                path=route,
            ) from e
        return resp  # type: ignore[no-any-return]

    @staticmethod
    def _refusal(e: urllib.error.HTTPError, method: str, route: str) -> SonicError:
        try:
            text = e.read(64 * 1024).decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            text = ""
        finally:
            e.close()
        body: Optional[Dict[str, Any]] = None
        message = ""
        try:
            doc = json.loads(text)
            if isinstance(doc, dict):
                body = doc
                if isinstance(doc.get("error"), str):
                    message = doc["error"]
        except ValueError:
            pass
        if not message:
            message = (
                text.strip()[:300] or (e.reason if isinstance(e.reason, str) else "") or "refused"
            )
        return SonicError(e.code, message, body=body, method=method, path=route)

    def _json(
        self,
        method: str,
        path: str,
        *,
        body: Optional[Any] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> Tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode("utf-8")
        with self._open(
            method,
            path,
            data=data,
            content_type="application/json" if data is not None else None,
            headers=headers,
        ) as resp:
            status = resp.status
            raw = resp.read()
        if not raw:
            return status, None
        try:
            return status, json.loads(raw)
        except ValueError as e:
            raise SonicError(
                None, f"unexpected answer to {method} {path.split('?', 1)[0]}: {e}"
            ) from e

    def _get(self, path: str) -> Any:
        return self._json("GET", path)[1]

    # ---- the control plane ----

    def health(self) -> Dict[str, Any]:
        """``GET /v1/health``: ``{"status": "ok", "version": ...}``."""
        doc = self._get("/v1/health")
        return doc if isinstance(doc, dict) else {}

    def agents(self) -> List[Dict[str, Any]]:
        """The registered agents (``GET /v1/agents``), as the server sends them."""
        doc = self._get("/v1/agents")
        return list(doc.get("agents", [])) if isinstance(doc, dict) else []

    # ---- DAGs ----

    def apply(
        self,
        dag: Union[Dag, str, PathArg],
        *,
        file: Optional[str] = None,
    ) -> DagInfo:
        """Registers a DAG under its name (``PUT /v1/dags``) and returns its summary.

        ``dag`` is a :class:`~sonic_client.Dag`, a path (a :class:`pathlib.Path`, or a string naming an
        existing file with no newline in it), or the YAML text itself. ``file`` names it in the
        server's error messages (default: the DAG's name plus ``.yaml``, or the path).
        ``created`` on the answer says whether it was new; applying a changed file raises its
        ``revision``. A file the server refuses raises :class:`~sonic_client.SonicError` (400) saying
        where and why (``e.line``, ``e.field``).
        """
        if isinstance(dag, Dag):
            text = dag.to_yaml()
            name = file or f"{dag.name}.yaml"
        elif isinstance(dag, str) and ("\n" in dag or not os.path.isfile(dag)):
            if "\n" not in dag and dag.endswith((".yaml", ".yml", ".json")):
                raise FileNotFoundError(f"no such DAG file: {dag}")
            text = dag
            name = file or ""
        else:
            path = os.fspath(dag)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            name = file or path
        query = f"?file={_quote(name)}" if name else ""
        with self._open(
            "PUT",
            f"/v1/dags{query}",
            data=text.encode("utf-8"),
            content_type="application/yaml",
        ) as resp:
            status = resp.status
            raw = resp.read()
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise SonicError(None, f"unexpected answer to PUT /v1/dags: {e}") from e
        return DagInfo.from_json(doc, created=status == 201)

    def dags(self) -> List[DagInfo]:
        """Every registered DAG, by name."""
        doc = self._get("/v1/dags")
        return [DagInfo.from_json(d) for d in (doc or {}).get("dags", [])]

    def dag(self, name: str) -> DagDetail:
        """One DAG: its summary, the file as applied (``yaml``) and the checked DAG (``parsed``)."""
        return DagDetail.from_json(self._get(f"/v1/dags/{_quote(name)}"))

    def delete_dag(self, name: str) -> None:
        """Removes a DAG's definition (its jobs, samples and models stay)."""
        self._open("DELETE", f"/v1/dags/{_quote(name)}").close()

    def models(self, name: str, params: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """What online profiling learned of a DAG (``GET /v1/dags/{name}/models``)."""
        query = f"?params={_quote(json.dumps(dict(params)))}" if params else ""
        doc = self._get(f"/v1/dags/{_quote(name)}/models{query}")
        return doc if isinstance(doc, dict) else {}

    def plan(self, name: str, input_bytes: int, *, policy: Optional[str] = None) -> Dict[str, Any]:
        """The plan a job of that input size would get (``GET /v1/dags/{name}/plan``)."""
        q = {"input_bytes": str(int(input_bytes))}
        if policy:
            q["policy"] = policy
        doc = self._get(f"/v1/dags/{_quote(name)}/plan?{urllib.parse.urlencode(q)}")
        return doc if isinstance(doc, dict) else {}

    # ---- jobs ----

    def run(
        self,
        dag: Union[Dag, str],
        input: Optional[Input] = None,
        params: Optional[Mapping[str, Any]] = None,
        policy: Optional[str] = None,
        key: Optional[str] = None,
        wait: bool = True,
        **options: Any,
    ) -> Dict[str, Any]:
        """Runs a job of an applied DAG and returns its summary as the server gives it, a dict
        (``GET /v1/jobs/{id}``: ``job_id``, ``status``, ``latency_s``, ``functions``, ...; the
        contract of interfaces.md). With ``wait=False`` it returns once the job is accepted, with
        the submission's answer (``job_id``, ``status``). ``input``, ``params``, ``policy`` and
        ``key`` are :meth:`submit`'s, as are the other ``options`` (``input_name``,
        ``input_key``, ``planned``, ``slo``, ``slo_best_effort``, ``revision``, ``progress``,
        ``timeout``).
        :meth:`submit` returns a :class:`Job` handle instead.
        """
        job = self.submit(
            dag, input, params=params, policy=policy, key=key, wait=wait, **options
        )
        if not wait:
            return {"job_id": job.id, "status": job.status, "existed": job.existed}
        doc = self._get(f"/v1/jobs/{_quote(job.id)}")
        if not isinstance(doc, dict):
            raise SonicError(None, f"unexpected answer to GET /v1/jobs/{job.id}: {doc!r}")
        return doc

    def submit(
        self,
        dag: Union[Dag, str],
        input: Optional[Input] = None,
        *,
        params: Optional[Mapping[str, Any]] = None,
        policy: Optional[str] = None,
        wait: bool = False,
        key: Optional[str] = None,
        input_name: Optional[str] = None,
        input_key: Optional[str] = None,
        planned: bool = False,
        slo: Optional[Mapping[str, float]] = None,
        slo_best_effort: bool = False,
        revision: Optional[int] = None,
        progress: Optional[Progress] = None,
        timeout: Optional[float] = None,
    ) -> "Job":
        """Submits a job of an applied DAG (``POST /v1/jobs``) and returns it.

        ``input`` is a file's path or its bytes, sent inline (base64 in the request, so within
        the server's ``max_body``: 1 MiB by default, 1 GiB under ``ofctl up``); the first
        functions read it as ``input/<name>``, ``name`` being ``input_name``, else the file's
        name, else ``input``. ``input_key`` names an object already in the cluster's store
        instead. ``params`` overrides the DAG's parameters. ``policy`` forces ``remote``,
        ``direct``, ``local``, ``memory`` or ``sonic`` (default: the DAG's mode decides);
        ``planned`` places a forced baseline as the planner would. ``slo`` is a percentile
        objective, ``{"percentile": 95, "latency_s": 20.0}``. ``revision`` runs that revision of
        the DAG (:meth:`dag` lists them) instead of the one applied last.

        ``key`` is sent as the ``Idempotency-Key`` header (1 to 255 visible ASCII characters,
        else ValueError): submitting the DAG again with the
        same key returns the job the key made first (``job.existed`` is then True) and starts
        nothing. With ``wait=True`` the call follows the job to its end (see :meth:`Job.wait`,
        with ``progress`` and ``timeout``) and ``job.summary`` holds its summary.
        """
        name = dag.name if isinstance(dag, Dag) else dag
        body: Dict[str, Any] = {"dag": name}
        if input is not None and input_key is not None:
            raise ValueError("input or input_key, not both")
        if input_key is not None:
            body["input"] = {"key": input_key, **({"name": input_name} if input_name else {})}
        elif input is not None:
            if isinstance(input, (bytes, bytearray, memoryview)):
                data = bytes(input)
                fname = input_name
            else:
                path = os.fspath(input)
                with open(path, "rb") as f:
                    data = f.read()
                fname = input_name or _input_name(path)
            body["input"] = {"base64": base64.b64encode(data).decode("ascii")}
            if fname:
                body["input"]["name"] = fname
            del data
        if params:
            body["params"] = dict(params)
        if policy is not None:
            body["policy"] = policy
        if planned:
            body["planned"] = True
        if slo is not None:
            body["slo"] = dict(slo)
        if slo_best_effort:
            body["slo_best_effort"] = True
        if revision is not None:
            body["revision"] = int(revision)
        if key is not None and not (0 < len(key) <= 255 and all("!" <= c <= "~" for c in key)):
            raise ValueError(
                "key (the Idempotency-Key): 1 to 255 visible ASCII characters (no spaces)"
            )
        headers = {"Idempotency-Key": key} if key is not None else None
        status, doc = self._json("POST", "/v1/jobs", body=body, headers=headers)
        if not isinstance(doc, dict) or not isinstance(doc.get("job_id"), str):
            raise SonicError(None, f"unexpected answer to POST /v1/jobs: {doc!r}")
        job = Job(self, doc["job_id"], status=str(doc.get("status", "")), existed=status == 200)
        if wait:
            job.wait(progress=progress, timeout=timeout)
        return job

    def job(self, job_id: str) -> "Job":
        """A handle on a job by its id (no request is made)."""
        return Job(self, job_id)

    def get_job(self, job_id: str) -> JobSummary:
        """A job's summary now (``GET /v1/jobs/{id}``)."""
        return JobSummary.from_json(self._get(f"/v1/jobs/{_quote(job_id)}"))

    def jobs(
        self,
        dag: Optional[str] = None,
        *,
        status: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> List[JobSummary]:
        """Jobs, newest first: of one DAG, in one status (``queued``, ``running``,
        ``succeeded``, ``failed``), at most ``limit`` (the server's default is 100)."""
        q: Dict[str, str] = {}
        if dag is not None:
            q["dag"] = dag
        if status is not None:
            q["status"] = status
        if limit is not None:
            q["limit"] = str(int(limit))
        query = f"?{urllib.parse.urlencode(q)}" if q else ""
        doc = self._get(f"/v1/jobs{query}")
        return [JobSummary.from_json(j) for j in (doc or {}).get("jobs", [])]

    def cancel(self, job_id: str) -> JobSummary:
        """Cancels a queued or running job; it ends ``failed`` (``cancelled``). A job that already
        ended is a 400, an unknown one a 404."""
        return JobSummary.from_json(self._json("POST", f"/v1/jobs/{_quote(job_id)}/cancel")[1])

    def delete_job(self, job_id: str) -> None:
        """Deletes an ended job with its logs, results and input (``DELETE /v1/jobs/{id}``); the
        sample it taught the models stays. A job that has not ended is a 409 (cancel it
        first), an unknown one a 404."""
        self._open("DELETE", f"/v1/jobs/{_quote(job_id)}").close()

    # ---- secrets ----

    def set_secret(self, name: str, value: Union[str, bytes]) -> None:
        """Sets a secret in the control plane's store (``PUT /v1/secrets/{name}``): a DAG's
        function names it as ``env={"VAR": {"secret": name}}``. The value is UTF-8 text, at most
        64 KiB; it is never served back."""
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        self._open(
            "PUT",
            f"/v1/secrets/{_quote(name)}",
            data=data,
            content_type="application/octet-stream",
        ).close()

    def secrets(self) -> List[Dict[str, Any]]:
        """The secrets functions may name (``GET /v1/secrets``): ``name``, ``bytes``,
        ``source`` (``store`` or ``file``) and ``updated_ms``, never values."""
        doc = self._get("/v1/secrets")
        return list(doc.get("secrets", [])) if isinstance(doc, dict) else []

    def delete_secret(self, name: str) -> None:
        """Deletes a secret from the store (``DELETE /v1/secrets/{name}``); an unknown one is a
        404."""
        self._open("DELETE", f"/v1/secrets/{_quote(name)}").close()

    def retry(
        self,
        job_id: str,
        *,
        wait: bool = True,
        progress: Optional[Progress] = None,
        timeout: Optional[float] = None,
    ) -> "Job":
        """Runs a failed or cancelled job again under its id (``POST /v1/jobs/{id}/retry``): its
        instances that succeeded before are not run again (``reused`` in the summary's
        functions), its revision, parameters and input are its own. A job that has not failed,
        or whose kept files were deleted (the control plane's ``keep_failed``), is a 409. With
        ``wait=True`` it follows the job to its end (``job.summary``)."""
        _, doc = self._json("POST", f"/v1/jobs/{_quote(job_id)}/retry")
        if not isinstance(doc, dict) or doc.get("job_id") != job_id:
            raise SonicError(None, f"unexpected answer to POST /v1/jobs/{job_id}/retry: {doc!r}")
        job = Job(self, job_id, status=str(doc.get("status", "")))
        if wait:
            job.wait(progress=progress, timeout=timeout)
        return job

    def events(
        self, job_id: str, *, read_timeout: float = _EVENT_READ_TIMEOUT
    ) -> Generator[JobEvent, None, None]:
        """The job's progress as it happens (``GET /v1/jobs/{id}/events``): its state now, then
        each change (intermediate ones may be coalesced), ending after the event whose status is
        ``succeeded`` or ``failed``."""
        resp = self._open(
            "GET",
            f"/v1/jobs/{_quote(job_id)}/events",
            headers={"Accept": "text/event-stream"},
            timeout=read_timeout,
        )
        with resp:
            ctype = resp.headers.get("Content-Type", "")
            if not ctype.startswith("text/event-stream"):
                raise SonicError(
                    None, f"GET /v1/jobs/{job_id}/events answered {ctype!r}, not events"
                )
            data: List[str] = []
            while True:
                raw = resp.readline()
                if not raw:
                    return
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
                    continue
                if line or not data:
                    continue  # a comment (keep-alive), another field, or nothing yet
                text = "\n".join(data)
                data = []
                try:
                    doc = json.loads(text)
                except ValueError:
                    continue
                if isinstance(doc, dict):
                    ev = JobEvent.from_json(doc)
                    yield ev
                    if ev.ended:
                        return

    def wait(
        self,
        job_id: str,
        progress: Optional[Progress] = None,
        timeout: Optional[float] = None,
        *,
        poll_interval: float = 0.5,
    ) -> JobSummary:
        """Follows a job until it ends and returns its summary (see :meth:`Job.wait`)."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def remaining() -> Optional[float]:
            return None if deadline is None else deadline - time.monotonic()

        notified = False
        read_timeout = _EVENT_READ_TIMEOUT
        left = remaining()
        if left is not None:
            read_timeout = max(0.1, min(read_timeout, left))
        stream = self.events(job_id, read_timeout=read_timeout)
        try:
            for ev in stream:
                if progress is not None:
                    progress(ev)
                notified = notified or ev.ended
                left = remaining()
                if left is not None and left <= 0:
                    break  # the polling below says it timed out, unless the job just ended
        except SonicError as e:
            # A control plane without the events route, or a stream that broke or went quiet
            # (a deadline within the stream's silence): polling takes over. Else, its refusal.
            route_missing = (e.status == 404 and e.message == "no such route") or e.status == 405
            if e.status is not None and not route_missing:
                raise
        except (OSError, http.client.HTTPException):
            pass
        finally:
            stream.close()
        last: Optional[str] = None
        while True:
            s = self.get_job(job_id)
            if progress is not None and s.status != last and not (s.ended and notified):
                progress(JobEvent(s.job_id, s.status, None, 0, 0, None, raw={}))
            last = s.status
            if s.ended:
                return s
            left = remaining()
            if left is not None and left <= 0:
                raise TimeoutError(f"job {job_id} is still {s.status} after {timeout} s")
            time.sleep(poll_interval if left is None else max(0.0, min(poll_interval, left)))

    def logs(self, job_id: str, function: Optional[str] = None) -> List[InstanceLog]:
        """What each instance attempt wrote (the tail of its standard output and error), by
        function, instance and attempt; of one function when ``function`` is given."""
        query = f"?function={_quote(function)}" if function is not None else ""
        doc = self._get(f"/v1/jobs/{_quote(job_id)}/logs{query}")
        return [InstanceLog.from_json(entry) for entry in (doc or {}).get("logs", [])]

    # ---- results ----

    def results(self, job_id: str) -> List["Result"]:
        """The results of a succeeded job, one per output (nothing is downloaded yet). A job
        that did not succeed raises :class:`~sonic_client.SonicError` with its status and error."""
        s = self.get_job(job_id)
        if not s.succeeded:
            why = f": {s.error}" if s.error else ""
            raise SonicError(None, f"job {job_id} is {s.status}, it has no results to fetch{why}")
        return [Result(self, job_id, _result_key(job_id, o), o) for o in s.outputs]

    def fetch(self, job_id: str, to: PathArg) -> List[FetchedFile]:
        """Downloads every result of a succeeded job into the folder ``to``, keeping each one's
        path under the job's ``result/`` (``to/sink/0/out``), streamed to disk; as ``ofctl
        fetch``. Returns the files written."""
        out: List[FetchedFile] = []
        for r in self.results(job_id):
            dest = Path(to, *r.key.split("/"))
            n = r.save(dest)
            out.append(FetchedFile(output=r.output, key=r.key, path=str(dest), bytes=n))
        return out

    def _open_result(self, job_id: str, key: str) -> http.client.HTTPResponse:
        path = "/".join(_quote(p) for p in key.split("/"))
        return self._open(
            "GET",
            f"/v1/jobs/{_quote(job_id)}/results/{path}",
            timeout=max(self.timeout, 300.0),
        )


@dataclass
class Result:
    """One result object of a job: ``key`` is its path under the job's ``result/``."""

    client: Client = field(repr=False, compare=False)
    job_id: str
    key: str
    #: As the summary lists it: ``store://jobs/<id>/result/<key>``.
    output: str

    def open(self) -> IO[bytes]:
        """The object's bytes as a stream (``GET /v1/jobs/{id}/results/{key}``); close it."""
        return self.client._open_result(self.job_id, self.key)

    def read(self) -> bytes:
        """The whole object in memory (for small results; :meth:`save` streams to a file)."""
        with self.open() as f:
            return f.read()

    def save(self, path: PathArg) -> int:
        """Streams the object into ``path`` (its folders made; written under a temporary name,
        then renamed) and returns its size in bytes."""
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}.sonic-{os.getpid()}"
        try:
            with self.open() as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
                out.flush()
                os.fsync(out.fileno())
                n = out.tell()
            os.replace(tmp, dest)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return n


class Job:
    """A submitted job: ``id``, and what was known when it was made.

    ``status`` is its status when submitted; ``existed`` is True when the submission's
    ``Idempotency-Key`` returned a job made before; ``summary`` is the last summary read
    (by :meth:`get`, :meth:`wait` or ``run(wait=True)``), None until then.
    """

    def __init__(
        self, client: Client, job_id: str, *, status: str = "", existed: bool = False
    ) -> None:
        self.client = client
        self.id = job_id
        self.status = status
        self.existed = existed
        self.summary: Optional[JobSummary] = None

    def __repr__(self) -> str:
        return f"Job({self.id!r}, status={self.status!r})"

    def get(self) -> JobSummary:
        """Its summary now."""
        self.summary = self.client.get_job(self.id)
        self.status = self.summary.status
        return self.summary

    def wait(
        self,
        progress: Optional[Progress] = None,
        timeout: Optional[float] = None,
        *,
        poll_interval: float = 0.5,
    ) -> JobSummary:
        """Follows the job until it ends (``succeeded`` or ``failed``) and returns its summary.

        It reads the job's event stream, calling ``progress`` (when given) with each
        :class:`~sonic_client.JobEvent` (status, running stage, instances done of total, why it
        waits), and polls every ``poll_interval`` s where the stream is not served. Past
        ``timeout`` seconds it raises :class:`TimeoutError` (the job goes on). A failed job is
        returned, not raised: check ``summary.succeeded`` and ``summary.error``.
        """
        self.summary = self.client.wait(self.id, progress, timeout, poll_interval=poll_interval)
        self.status = self.summary.status
        return self.summary

    def cancel(self) -> JobSummary:
        """Cancels it (see :meth:`Client.cancel`)."""
        self.summary = self.client.cancel(self.id)
        self.status = self.summary.status
        return self.summary

    def events(self) -> Iterator[JobEvent]:
        """Its progress as it happens (see :meth:`Client.events`)."""
        return self.client.events(self.id)

    def logs(self, function: Optional[str] = None) -> List[InstanceLog]:
        """What its instances wrote (see :meth:`Client.logs`)."""
        return self.client.logs(self.id, function)

    def results(self) -> List[Result]:
        """Its results, once it succeeded (see :meth:`Client.results`)."""
        return self.client.results(self.id)

    def fetch(self, folder: PathArg) -> List[FetchedFile]:
        """Downloads its results into ``folder`` (see :meth:`Client.fetch`)."""
        return self.client.fetch(self.id, folder)
