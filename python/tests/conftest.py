"""The client's tests run against a real control plane, never a mock: SONIC_SERVER and
SONIC_TOKEN name it. `cargo test -p ofctl --test it python_client` starts a cluster (the process
sandbox, the `synthetic` lambda), installs this package and pytest in a venv, and runs them.
Without those variables every test fails, saying so: they are never skipped."""

from __future__ import annotations

import os
import uuid
from typing import Iterator

import pytest

import sonic_client as sonic

#: Makes this run's DAG names and idempotency keys its own, on a control plane used before.
RUN = uuid.uuid4().hex[:8]


@pytest.fixture(scope="session", autouse=True)
def control_plane() -> Iterator[str]:
    missing = [v for v in ("SONIC_SERVER", "SONIC_TOKEN") if not os.environ.get(v)]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not set: these tests run against a real control plane "
            "(`cargo test -p ofctl --test it python_client` starts one and sets them; or "
            "`ofctl up`, then SONIC_SERVER=... SONIC_TOKEN=... python -m pytest python/tests)",
            pytrace=False,
        )
    yield os.environ["SONIC_SERVER"]


@pytest.fixture
def client() -> sonic.Client:
    return sonic.Client()


def name(stem: str) -> str:
    """A DAG name of this run: ``[a-z0-9-]``, at most 63."""
    return f"py-{stem}-{RUN}"
