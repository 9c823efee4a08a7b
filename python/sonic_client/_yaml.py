"""A small YAML emitter for DAG files (the standard library has none).

It writes block mappings and sequences, short collections in flow style (``[synthetic, copy]``,
``{ from: a, to: b, kind: one }``), and every scalar either plain, when it cannot be read as
anything but that string, or double-quoted as JSON (a JSON string is a YAML double-quoted
scalar). The output reads like the DAG files under ``dags/``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, List, Mapping, Optional, Sequence

# Words a YAML 1.1 or 1.2 reader may take for a boolean, a null or a float.
_RESERVED = frozenset("y n yes no on off true false null nan inf infinity".split())
_PLAIN_BLOCK = re.compile(r"^(?:[A-Za-z_/]|--?[A-Za-z])[A-Za-z0-9_./:-]*$")
_PLAIN_FLOW = re.compile(r"^(?:[A-Za-z_/]|--?[A-Za-z])[A-Za-z0-9_./-]*$")
_DURATION = re.compile(r"^[0-9]+(?:\.[0-9]+)?(?:ms|s|m|h)$")
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_WIDTH = 100


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, bool, int, float))


def scalar(v: Any, flow: bool = False) -> str:
    """One scalar: plain where that is unambiguous, else a JSON (YAML double-quoted) string."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v!r} cannot be written in a DAG file")
        return repr(v)
    if isinstance(v, str):
        plain = _PLAIN_FLOW if flow else _PLAIN_BLOCK
        if plain.match(v) and v.lower() not in _RESERVED and not v.endswith(":"):
            return v
        if _DURATION.match(v):
            return v
        return json.dumps(v, ensure_ascii=False)
    raise TypeError(f"{type(v).__name__} cannot be written in a DAG file: {v!r}")


def key(k: Any) -> str:
    if not isinstance(k, str):
        raise TypeError(f"a mapping key must be a string, not {k!r}")
    if _PLAIN_KEY.match(k) and k.lower() not in _RESERVED:
        return k
    return json.dumps(k, ensure_ascii=False)


def _flow(v: Any, depth: int = 0) -> Optional[str]:
    """``v`` in flow style when it is a scalar or a shallow collection; else None."""
    if _is_scalar(v):
        return scalar(v, flow=depth > 0)
    if isinstance(v, (bytes, bytearray, memoryview)):
        raise TypeError(f"bytes cannot be written in a DAG file: {v!r}")
    if depth >= 2:
        return None
    if isinstance(v, Mapping):
        if not v:
            return "{}"
        parts = []
        for k, item in v.items():
            s = _flow(item, depth + 1)
            if s is None:
                return None
            parts.append(f"{key(k)}: {s}")
        return "{ " + ", ".join(parts) + " }"
    if isinstance(v, Sequence):
        parts = []
        for item in v:
            s = _flow(item, depth + 1)
            if s is None:
                return None
            parts.append(s)
        return "[" + ", ".join(parts) + "]"
    raise TypeError(f"{type(v).__name__} cannot be written in a DAG file: {v!r}")


def _mapping(
    d: Mapping[str, Any], indent: int, out: List[str], first: Optional[str] = None
) -> None:
    """Writes ``d`` as a block mapping; ``first`` replaces the first line's indentation (``- ``)."""
    pad = " " * indent
    for i, (k, v) in enumerate(d.items()):
        lead = first if (i == 0 and first is not None) else pad
        head = f"{lead}{key(k)}:"
        flat = _flow(v)
        # Scalars, lists of scalars, and below the top level short mappings, on one line.
        inline = (
            _is_scalar(v)
            or (isinstance(v, Mapping) and (indent > 0 or not v))
            or (not isinstance(v, Mapping) and all(_is_scalar(x) for x in v))
        )
        if flat is not None and inline and (_is_scalar(v) or len(head) + 1 + len(flat) <= _WIDTH):
            out.append(f"{head} {flat}")
        elif isinstance(v, Mapping):
            out.append(head)
            _mapping(v, indent + 2, out)
        else:
            out.append(head)
            _sequence(v, indent + 2, out)


def _sequence(items: Sequence[Any], indent: int, out: List[str]) -> None:
    pad = " " * indent
    for item in items:
        flat = _flow(item)
        # A mapping with a list in it (a function's command) is written as a block.
        short = not isinstance(item, Mapping) or not any(
            isinstance(x, Sequence) and not isinstance(x, str) for x in item.values()
        )
        if flat is not None and short and indent + 2 + len(flat) <= _WIDTH:
            out.append(f"{pad}- {flat}")
        elif isinstance(item, Mapping) and item:
            _mapping(item, indent + 2, out, first=f"{pad}- ")
        elif isinstance(item, Sequence) and not isinstance(item, str) and item:
            out.append(f"{pad}-")
            _sequence(item, indent + 2, out)
        else:
            out.append(f"{pad}- {_flow(item)}")


def dump(doc: Mapping[str, Any]) -> str:
    """The YAML text of a mapping (a DAG file), ending with a newline."""
    out: List[str] = []
    _mapping(doc, 0, out)
    return "\n".join(out) + "\n"
