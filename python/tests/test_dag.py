"""The builder's YAML, read back by the control plane that takes it (see conftest.py)."""

from __future__ import annotations

import datetime
import doctest

import pytest
from conftest import name

import sonic_client as sonic

IMAGE = "sonic-lambdas:latest"


def test_every_field_the_builder_writes_is_read_back(client: sonic.Client) -> None:
    dag = sonic.Dag(
        name("full"),
        description='quotes " and colons: and a # too\nsecond line',
        params={"trees": 3, "label": "yes", "seed": 42, "rate": 0.5, "fast": True},
        work_params=["trees"],
        bounds={"max_latency": 120, "max_cost_usd": 0.05},
        deadline=datetime.timedelta(minutes=10),
        slo={"percentile": 95, "latency": 20.5},
        on_failure="notify",
        input="required",
    )
    dag.function(
        "split",
        image=IMAGE,
        command=["synthetic", "copy", "--to", "train", "--output-bytes", "1000", "a: b", "#x"],
        timeout=1.5,
        retries={"limit": 2, "backoff": 0.25, "on": ["error", "timeout"]},
        env={"MODE": "fast", "LEVEL": 3, "FLAG": True, "TEXT": "on"},
    )
    dag.function(
        "train", image=IMAGE, command=["synthetic", "copy", "--to", "combine"], instances="trees"
    )
    dag.function("combine", image=IMAGE, command=["synthetic", "copy", "--to", "result"])
    dag.function("notify", image=IMAGE, command=["synthetic", "noop"])
    dag.edge("split", "train", "broadcast").edge("train", "combine", "gather")

    client.apply(dag)
    parsed = client.dag(dag.name).parsed
    assert parsed["description"] == dag.description
    assert parsed["params"] == {"trees": 3, "label": "yes", "seed": 42, "rate": 0.5, "fast": True}
    split = parsed["functions"][0]
    assert split["name"] == "split"
    assert split["command"] == [
        "synthetic",
        "copy",
        "--to",
        "train",
        "--output-bytes",
        "1000",
        "a: b",
        "#x",
    ]
    assert split["timeout_s"] == 1.5
    assert split["env"] == {"MODE": "fast", "LEVEL": "3", "FLAG": "true", "TEXT": "on"}, split
    assert split["retries"]["limit"] == 2, split
    # The on_failure function is set apart from the DAG's stages.
    assert [f["name"] for f in parsed["functions"]] == ["split", "train", "combine"], parsed
    assert parsed["on_failure"]["name"] == "notify", parsed
    assert parsed["input_required"] is True, parsed
    text = dag.to_yaml()
    assert "timeout: 1500ms" in text and "deadline: 600s" in text, text
    assert 'instances: "{{ params.trees }}"' in text, text


def test_the_builders_own_checks() -> None:
    dag = sonic.Dag("x").function("a", image=IMAGE, command=["synthetic"])
    with pytest.raises(ValueError):
        dag.function("a", image=IMAGE, command=["synthetic"])
    with pytest.raises(ValueError):
        dag.function("b", handler="h", image=IMAGE)
    with pytest.raises(TypeError):
        dag.function("c", image=IMAGE, command="synthetic copy")
    assert sonic.duration(30) == "30s"
    assert sonic.duration(0.25) == "250ms"
    assert sonic.duration(datetime.timedelta(seconds=90)) == "90s"
    assert sonic.duration("2h") == "2h"
    assert sonic.param_ref("n") == "{{ params.n }}"


def test_the_modules_examples_hold() -> None:
    import sonic_client.dag

    assert doctest.testmod(sonic_client.dag).failed == 0
    assert doctest.testmod(sonic).failed == 0
