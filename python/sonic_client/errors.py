"""The one exception the client raises for what the control plane refused or could not answer."""

from __future__ import annotations

from typing import Any, Dict, Optional


class SonicError(Exception):
    """A request the control plane refused, or could not be asked.

    ``status`` is the HTTP status (``400``, ``404``, ...) or ``None`` when there was no answer
    (the server unreachable, a job that cannot be fetched because it failed, ...).
    ``message`` is the server's own words, the ``error`` field of its JSON error body
    (docs/api.md, "Errors"); ``body`` is that whole body when it was JSON (a refused DAG file
    also has ``file``, ``line``, ``column`` and ``field``).
    """

    def __init__(
        self,
        status: Optional[int],
        message: str,
        *,
        body: Optional[Dict[str, Any]] = None,
        method: Optional[str] = None,
        path: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body
        self.method = method
        self.path = path

    @property
    def field(self) -> Optional[str]:
        """A refused DAG file's field (``edges[0].to``), when the server named one."""
        f = (self.body or {}).get("field")
        return f if isinstance(f, str) and f else None

    @property
    def line(self) -> Optional[int]:
        """A refused DAG file's line, when the server gave one."""
        v = (self.body or {}).get("line")
        return v if isinstance(v, int) else None

    def __str__(self) -> str:
        if self.status is None:
            return self.message
        return f"{self.message} (HTTP {self.status})"

    def __repr__(self) -> str:
        return f"SonicError(status={self.status!r}, message={self.message!r})"
