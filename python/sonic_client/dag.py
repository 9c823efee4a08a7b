"""Building a DAG file in Python.

A :class:`Dag` holds what a DAG file holds (docs/dag-format.md) and writes the same YAML
``ofctl apply`` sends, so that ``client.apply(dag)`` and ``ofctl apply -f`` register the same
thing. The control plane checks it: a mistake comes back as a :class:`~sonic_client.SonicError` (400)
naming the line and the field of :meth:`Dag.to_yaml`'s text.

>>> from sonic_client import Dag
>>> img = "sonic-lambdas:latest"
>>> dag = (
...     Dag("copy-twice", description="gen copies its input to mid, mid to result/")
...     .function("gen", image=img, command=["synthetic", "copy", "--to", "mid"])
...     .function("mid", image=img, command=["synthetic", "copy", "--to", "result"])
...     .edge("gen", "mid", "one")
... )
>>> print(dag.to_yaml(), end="")
name: copy-twice
description: "gen copies its input to mid, mid to result/"
functions:
  - name: gen
    image: sonic-lambdas:latest
    command: [synthetic, copy, --to, mid]
  - name: mid
    image: sonic-lambdas:latest
    command: [synthetic, copy, --to, result]
edges:
  - { from: gen, to: mid, kind: one }
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Union

from . import _yaml

#: A duration: seconds (``30``, ``0.5``), a :class:`datetime.timedelta`, or the file's own
#: text (``"300s"``, ``"500ms"``, ``"10m"``, ``"2h"``).
Duration = Union[int, float, str, datetime.timedelta]

#: How an edge maps the sender's instances to the receiver's (docs/dag-format.md, "Fanouts and
#: edge kinds").
EdgeKind = Literal["one", "scatter", "broadcast", "gather", "shuffle"]

#: A parameter's value: a number, a string or a boolean.
ParamValue = Union[int, float, str, bool]

_TEMPLATE = re.compile(r"^\{\{\s*params\.[A-Za-z0-9_-]+\s*\}\}$")


def duration(d: Duration) -> str:
    """A duration as a DAG file writes it: ``30`` -> ``"30s"``, ``0.25`` -> ``"250ms"``."""
    if isinstance(d, bool):
        raise TypeError(f"a duration is seconds, a timedelta or text, not {d!r}")
    if isinstance(d, datetime.timedelta):
        ms = round(d.total_seconds() * 1000)
        return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"
    if isinstance(d, int):
        return f"{d}s"
    if isinstance(d, float):
        ms = round(d * 1000)
        return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"
    if isinstance(d, str):
        return d
    raise TypeError(f"a duration is seconds, a timedelta or text, not {d!r}")


def param_ref(name: str) -> str:
    """The reference to a job parameter an ``instances`` count may be: ``{{ params.NAME }}``."""
    return "{{ params." + name + " }}"


class Dag:
    """A DAG of functions, built step by step; each method returns the DAG, so calls chain.

    Parameters mirror the file's top-level keys (docs/dag-format.md): ``params`` (job parameters
    and their defaults, overridable per job), ``work_params`` (the parameters that change the
    work), ``bounds`` (``max_latency``, ``max_cost_usd``), ``deadline``, ``slo``
    (``percentile``, ``latency``, ``best_effort``), ``triggers`` (``{"schedule": "@every
    1h"}``, ``{"object_created": {"prefix": "incoming/"}}``) and ``on_failure`` (the name of a
    function of the DAG, with no edges, run once when a job fails) and ``input``
    (``"required"``: a job without an input is refused; ``"optional"``, the default).
    """

    def __init__(
        self,
        name: str,
        *,
        description: Optional[str] = None,
        params: Optional[Mapping[str, ParamValue]] = None,
        work_params: Optional[Sequence[str]] = None,
        bounds: Optional[Mapping[str, Any]] = None,
        deadline: Optional[Duration] = None,
        slo: Optional[Mapping[str, Any]] = None,
        triggers: Optional[Sequence[Mapping[str, Any]]] = None,
        on_failure: Optional[str] = None,
        input: Optional[str] = None,
    ) -> None:
        self.name = name
        self.description = description
        self.params: Dict[str, ParamValue] = dict(params or {})
        self.work_params: Optional[List[str]] = (
            list(work_params) if work_params is not None else None
        )
        self.bounds: Optional[Dict[str, Any]] = dict(bounds) if bounds is not None else None
        self.deadline = deadline
        self.slo: Optional[Dict[str, Any]] = dict(slo) if slo is not None else None
        self.triggers: List[Dict[str, Any]] = [dict(t) for t in (triggers or [])]
        self.on_failure = on_failure
        self.input = input
        self.functions: List[Dict[str, Any]] = []
        self.edges: List[Dict[str, str]] = []

    def param(self, name: str, default: ParamValue) -> "Dag":
        """Declares a job parameter with its default (a job's ``params={...}`` overrides it)."""
        self.params[name] = default
        return self

    def function(
        self,
        name: str,
        *,
        image: Optional[str] = None,
        command: Optional[Sequence[str]] = None,
        handler: Optional[str] = None,
        instances: Optional[Union[int, str]] = None,
        timeout: Optional[Duration] = None,
        retries: Optional[Mapping[str, Any]] = None,
        env: Optional[Mapping[str, Union[str, int, float, bool, Mapping[str, str]]]] = None,
    ) -> "Dag":
        """Adds a function: an executable (``image`` and ``command``) or a registered Python
        handler (``handler``, docs/python.md), never both.

        ``instances`` is a count, or the name of a declared parameter (``"trees"``, written
        ``{{ params.trees }}``); leave it out where the incoming edges fix the fanout.
        ``timeout`` defaults to the server's 300 s. ``retries`` is ``{"limit": 4, "backoff":
        0.5, "on": ["error", "timeout", "oom", "lost"]}``, each key optional. ``env`` sets
        environment variables of its runs; a value ``{"secret": NAME}`` takes a secret of the
        control plane (``Client.set_secret``) that the DAG names but never shows.
        """
        if any(f["name"] == name for f in self.functions):
            raise ValueError(f"DAG {self.name} already has a function {name!r}")
        if handler is not None and (image is not None or command is not None):
            raise ValueError(f"function {name}: a handler, or an image and a command, not both")
        f: Dict[str, Any] = {"name": name}
        if handler is not None:
            f["handler"] = handler
        if image is not None:
            f["image"] = image
        if command is not None:
            if isinstance(command, str):
                raise TypeError(f"function {name}: command is a list of words, not {command!r}")
            f["command"] = [str(w) for w in command]
        if instances is not None:
            if isinstance(instances, bool):
                raise TypeError(f"function {name}: instances is a count or a parameter name")
            if isinstance(instances, str) and not _TEMPLATE.match(instances):
                instances = param_ref(instances)
            f["instances"] = instances
        if timeout is not None:
            f["timeout"] = duration(timeout)
        if retries is not None:
            r = dict(retries)
            if "backoff" in r:
                r["backoff"] = duration(r["backoff"])
            f["retries"] = r
        if env is not None:
            f["env"] = dict(env)
        self.functions.append(f)
        return self

    def edge(self, source: str, target: str, kind: EdgeKind = "one") -> "Dag":
        """Adds an edge: ``source``'s outputs for ``target`` become its inputs.

        ``kind``: ``one`` (instance i to instance i), ``scatter`` (one receiver per file the
        single sender writes), ``broadcast`` (the single sender's files to every receiver),
        ``gather`` (every sender to the single receiver), ``shuffle`` (every sender to every
        receiver).
        """
        self.edges.append({"from": source, "to": target, "kind": kind})
        return self

    def to_dict(self) -> Dict[str, Any]:
        """The DAG file as a mapping, its keys in the file's order."""
        doc: Dict[str, Any] = {"name": self.name}
        if self.description is not None:
            doc["description"] = self.description
        if self.params:
            doc["params"] = dict(self.params)
        if self.work_params is not None:
            doc["work_params"] = list(self.work_params)
        doc["functions"] = [dict(f) for f in self.functions]
        if self.edges:
            doc["edges"] = [dict(e) for e in self.edges]
        if self.bounds is not None:
            b = dict(self.bounds)
            if "max_latency" in b:
                b["max_latency"] = duration(b["max_latency"])
            doc["bounds"] = b
        if self.deadline is not None:
            doc["deadline"] = duration(self.deadline)
        if self.slo is not None:
            s = dict(self.slo)
            if "latency" in s:
                s["latency"] = duration(s["latency"])
            doc["slo"] = s
        if self.triggers:
            doc["triggers"] = [dict(t) for t in self.triggers]
        if self.on_failure is not None:
            doc["on_failure"] = self.on_failure
        if self.input is not None:
            doc["input"] = self.input
        return doc

    def to_yaml(self) -> str:
        """The DAG file's text, as ``client.apply`` sends it."""
        return _yaml.dump(self.to_dict())

    def to_json(self) -> str:
        """The DAG file as JSON (the control plane takes JSON too: JSON is YAML)."""
        return json.dumps(self.to_dict(), indent=2)

    def __repr__(self) -> str:
        names = ", ".join(f["name"] for f in self.functions)
        return f"Dag({self.name!r}, functions=[{names}], edges={len(self.edges)})"
