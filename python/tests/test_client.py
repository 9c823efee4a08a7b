"""The Python client against a real control plane (see conftest.py)."""

from __future__ import annotations

import importlib.resources
import json
import os
from pathlib import Path
from typing import List

import pytest
from conftest import RUN, name

import sonic_client as sonic

IMAGE = "sonic-lambdas:latest"
METHODS = {"vm-storage", "direct", "remote", "memory"}


def chain(dag_name: str) -> sonic.Dag:
    """gen copies its input to mid, mid to sink, sink to result/: two `one` edges."""
    return (
        sonic.Dag(dag_name, description="gen -> mid -> sink, each copying its input")
        .function("gen", image=IMAGE, command=["synthetic", "copy", "--to", "mid"], timeout=60)
        .function("mid", image=IMAGE, command=["synthetic", "copy", "--to", "sink"], timeout=60)
        .function("sink", image=IMAGE, command=["synthetic", "copy", "--to", "result"], timeout=60)
        .edge("gen", "mid", "one")
        .edge("mid", "sink", "one")
    )


def fan(dag_name: str) -> sonic.Dag:
    """gen broadcasts its input to `mids` instances of mid; sink gathers their copies."""
    return (
        sonic.Dag(dag_name, params={"mids": 2})
        .function("gen", image=IMAGE, command=["synthetic", "copy", "--to", "mid"], timeout=60)
        .function(
            "mid",
            image=IMAGE,
            command=["synthetic", "copy", "--to", "sink"],
            instances="mids",
            timeout=60,
            env={"MODE": "fast"},
        )
        .function("sink", image=IMAGE, command=["synthetic", "copy", "--to", "result"], timeout=60)
        .edge("gen", "mid", "broadcast")
        .edge("mid", "sink", "gather")
    )


def payload(n: int = 100_000) -> bytes:
    return bytes((i * 7 + 3) % 251 for i in range(n))


def test_the_package_is_typed() -> None:
    assert (importlib.resources.files("sonic_client") / "py.typed").is_file()
    assert sonic.__version__


def test_a_dag_built_in_python_is_applied_as_written(client: sonic.Client) -> None:
    dag = fan(name("fan"))
    info = client.apply(dag)
    assert info.created is True, info
    assert info.name == dag.name
    assert info.functions == ["gen", "mid", "sink"]
    assert info.edges == 2
    # The same text again: nothing changes.
    again = client.apply(dag)
    assert again.created is False
    assert again.revision == info.revision

    detail = client.dag(dag.name)
    assert detail.yaml == dag.to_yaml()
    parsed = detail.parsed
    assert [f["name"] for f in parsed["functions"]] == ["gen", "mid", "sink"], parsed
    assert parsed["params"] == {"mids": 2}, parsed
    assert parsed["functions"][0]["timeout_s"] == 60, parsed
    assert dag.name in [d.name for d in client.dags()]

    # A changed file is a new revision.
    dag.param("mids", 3)
    changed = client.apply(dag)
    assert changed.created is False
    assert changed.revision == info.revision + 1


def test_run_is_the_contracts_one_call(client: sonic.Client, tmp_path: Path) -> None:
    """interfaces.md: ``Client.run(dag, input=None, params=None, policy=None, key=None,
    wait=True)`` returns the job summary as a dict; ``Client.fetch(job_id, to)``."""
    dag = chain(name("contract"))
    client.apply(dag)
    data = payload()
    summary = client.run(dag.name, data, None, "remote", f"py-{RUN}-contract")
    assert isinstance(summary, dict), summary
    assert summary["status"] == "succeeded", summary
    assert summary["dag"] == dag.name and summary["policy"] == "remote", summary
    assert summary["input_bytes"] == len(data)
    assert {f["name"] for f in summary["functions"]} == {"gen", "mid", "sink"}, summary
    # The same key again: the same job, not a second one.
    again = client.run(dag, input=data, key=f"py-{RUN}-contract")
    assert again["job_id"] == summary["job_id"], again
    fetched = client.fetch(job_id=summary["job_id"], to=tmp_path / "out")
    assert [Path(f.path).read_bytes() for f in fetched] == [data]
    # Without waiting: the submission's answer.
    accepted = client.run(dag, input=b"x", wait=False)
    assert accepted["job_id"].startswith("j-") and accepted["existed"] is False, accepted
    assert client.wait(accepted["job_id"], timeout=180).job_id == accepted["job_id"]


def test_run_wait_and_fetch_the_results(client: sonic.Client, tmp_path: Path) -> None:
    dag = chain(name("chain"))
    client.apply(dag)
    data = payload()
    src = tmp_path / "my data.bin"
    src.write_bytes(data)

    job = client.submit(dag, input=src)
    assert job.id.startswith("j-"), job
    assert job.existed is False
    events: List[sonic.JobEvent] = []
    summary = job.wait(progress=events.append, timeout=180)

    assert events, "the progress callback was never called"
    assert all(ev.job_id == job.id for ev in events), events
    assert events[-1].status == "succeeded", events
    assert summary.succeeded, summary.error
    assert summary.job_id == job.id and summary.dag == dag.name
    assert summary.input_bytes == len(data)
    assert summary.latency_s > 0 and summary.cost_usd > 0 and summary.perf_per_dollar > 0
    # Unforced, before its models converged: profiling, every edge through the store.
    assert summary.mode == "profiling" and summary.policy == "remote", summary
    assert summary.methods == {"gen->mid": "remote", "mid->sink": "remote"}, summary.edges
    assert all(e.bytes == len(data) for e in summary.edges), summary.edges
    assert sorted(f.name for f in summary.functions) == ["gen", "mid", "sink"]
    assert all(f.attempts >= 1 and f.seconds > 0 for f in summary.functions)
    assert summary.raw["job_id"] == job.id
    assert summary.submitted_ms is not None and summary.started_ms is not None
    assert summary.ended_ms is not None
    assert summary.submitted_ms <= summary.started_ms <= summary.ended_ms, summary
    assert len(summary.outputs) == 1, summary.outputs
    assert job.summary is summary

    # Results: listed, read, and streamed into a folder.
    results = job.results()
    assert len(results) == 1, results
    # The input's name, made safe ("my data.bin"), as copied along the chain.
    assert results[0].key.endswith("/input/my_data.bin"), results
    assert results[0].read() == data
    out = tmp_path / "out"
    fetched = client.fetch(job.id, out)
    assert len(fetched) == 1
    f = fetched[0]
    assert Path(f.path) == out.joinpath(*f.key.split("/"))
    assert f.bytes == len(data)
    assert Path(f.path).read_bytes() == data
    assert not [p for p in out.rglob(".*")], "a temporary file was left"

    # Its logs: one entry per instance attempt.
    logs = job.logs()
    assert sorted({entry.function for entry in logs}) == ["gen", "mid", "sink"], logs
    assert [entry.function for entry in job.logs("mid")] == ["mid"]
    with pytest.raises(sonic.SonicError) as e:
        job.logs("nowhere")
    assert e.value.status == 404
    assert "has no function nowhere" in e.value.message

    # The stream of a finished job is its last event.
    evs = list(job.events())
    assert [ev.status for ev in evs] == ["succeeded"], evs


def test_params_a_forced_policy_and_bytes_input(client: sonic.Client, tmp_path: Path) -> None:
    dag = fan(name("fan-run"))
    client.apply(dag)
    data = payload(30_000)
    job = client.submit(
        dag.name,
        input=data,
        input_name="data.bin",
        params={"mids": 3},
        policy="direct",
        wait=True,
        timeout=180,
    )
    s = job.summary
    assert s is not None and s.succeeded, s
    assert s.policy == "direct"
    assert sum(1 for f in s.functions if f.name == "mid") == 3, s.functions
    assert {e.method for e in s.edges} == {"direct"}, s.edges
    assert len(s.edges) == 2
    fetched = job.fetch(tmp_path / "out")
    # sink gathered three copies of the input.
    assert len(fetched) >= 1
    total = sum(f.bytes for f in fetched)
    assert total == 3 * len(data), fetched
    assert all(e.method in METHODS for e in client.get_job(job.id).edges)


def test_list_jobs(client: sonic.Client) -> None:
    dag = chain(name("listed"))
    client.apply(dag)
    first = client.submit(dag, input=b"one", wait=True, timeout=180)
    second = client.submit(dag, input=b"two", wait=True, timeout=180)
    jobs = client.jobs(dag=dag.name)
    assert [j.job_id for j in jobs] == [second.id, first.id], jobs
    assert all(j.dag == dag.name and j.succeeded for j in jobs)
    assert [j.job_id for j in client.jobs(dag=dag.name, limit=1)] == [second.id]
    assert client.jobs(dag=dag.name, status="failed") == []
    assert first.id in [j.job_id for j in client.jobs()]
    got = client.get_job(first.id)
    assert got.job_id == first.id and got.succeeded
    with pytest.raises(sonic.SonicError) as e:
        client.jobs(status="sleeping")
    assert e.value.status == 400


def test_a_resubmission_with_the_same_key_is_the_same_job(client: sonic.Client) -> None:
    dag = chain(name("keyed"))
    client.apply(dag)
    key = f"py-{RUN}-once"
    first = client.submit(dag, input=b"x" * 1000, key=key)
    again = client.submit(dag, input=b"x" * 1000, key=key)
    assert again.id == first.id
    assert first.existed is False and again.existed is True
    first.wait(timeout=180)
    third = client.submit(dag, input=b"x" * 1000, key=key)
    assert third.id == first.id and third.status == "succeeded"
    assert len(client.jobs(dag=dag.name)) == 1
    with pytest.raises(ValueError):
        client.submit(dag, input=b"x", key="has a space")
    other = client.submit(dag, input=b"y", key=f"py-{RUN}-twice")
    assert other.id != first.id
    other.wait(timeout=180)


def test_a_bad_dag_is_refused_with_the_servers_words(client: sonic.Client) -> None:
    dag = chain(name("bad")).edge("sink", "nowhere", "one")
    with pytest.raises(sonic.SonicError) as e:
        client.apply(dag)
    err = e.value
    assert err.status == 400, err
    assert 'unknown function "nowhere"' in err.message, err.message
    assert err.message.startswith(f"{dag.name}.yaml:"), err.message
    assert err.field == "edges[2].to", err.body
    assert err.line is not None and err.line > 1
    assert "(HTTP 400)" in str(err)
    # Nothing was stored.
    assert dag.name not in [d.name for d in client.dags()]

    # YAML text goes through as it is; so does a file.
    with pytest.raises(sonic.SonicError) as e:
        client.apply("name: Bad Name\nfunctions: []\n", file="typed.yaml")
    assert e.value.status == 400 and e.value.message.startswith("typed.yaml:"), e.value


def test_a_dag_file_and_yaml_text(client: sonic.Client, tmp_path: Path) -> None:
    text = chain(name("from-file")).to_yaml()
    path = tmp_path / "chain.yaml"
    path.write_text(text)
    info = client.apply(path)
    assert info.name == name("from-file") and info.created
    assert client.apply(str(path)).revision == info.revision
    assert client.apply(text).revision == info.revision
    client.delete_dag(info.name)
    assert info.name not in [d.name for d in client.dags()]
    with pytest.raises(sonic.SonicError) as e:
        client.dag(info.name)
    assert e.value.status == 404 and e.value.message == f"no dag named {info.name}"


def test_unknown_jobs_and_dags_are_404(client: sonic.Client) -> None:
    unknown = "j-0000000000000000"
    with pytest.raises(sonic.SonicError) as e:
        client.cancel(unknown)
    assert e.value.status == 404, e.value
    assert e.value.message == f"no job {unknown}"
    with pytest.raises(sonic.SonicError) as e:
        client.get_job(unknown)
    assert e.value.status == 404
    with pytest.raises(sonic.SonicError) as e:
        client.submit(name("never-applied"), input=b"x")
    assert e.value.status == 404 and "no dag named" in e.value.message


def test_cancel_a_running_job(client: sonic.Client) -> None:
    dag = sonic.Dag(name("nap")).function(
        "nap", image=IMAGE, command=["synthetic", "run", "--sleep-ms", "60000"], timeout=120
    )
    client.apply(dag)
    job = client.submit(dag)
    cancelled = job.cancel()
    assert cancelled.job_id == job.id
    s = job.wait(timeout=60)
    assert s.status == "failed", s
    assert "cancel" in (s.error or "") + (s.failure or ""), s
    with pytest.raises(sonic.SonicError) as e:
        job.cancel()
    assert e.value.status == 400 and "already failed" in e.value.message


def test_a_cancelled_job_retried_reuses_what_succeeded(client: sonic.Client) -> None:
    dag = (
        sonic.Dag(name("again"))
        .function("first", image=IMAGE, command=["synthetic", "copy", "--to", "nap"], timeout=60)
        .function(
            "nap", image=IMAGE, command=["synthetic", "run", "--sleep-ms", "60000"], timeout=120
        )
        .edge("first", "nap")
    )
    client.apply(dag)
    job = client.submit(dag, input=b"some input")
    # Cancelled once `first` succeeded (and `nap` runs).
    for ev in client.events(job.id):
        if ev.done_instances >= 1 or ev.ended:
            break
    job.cancel()
    s = job.wait(timeout=60)
    assert s.status == "failed", s
    assert [(f.name, f.reused) for f in s.functions] == [("first", False)], s
    # Queued again under its id; `first` is restored, not run again; `nap` is cancelled again.
    retried = client.retry(job.id, wait=False)
    assert retried.id == job.id
    for ev in client.events(job.id):
        if ev.done_instances >= 1 or ev.ended:
            break
    job.cancel()
    s = job.wait(timeout=60)
    assert s.status == "failed", s
    assert [(f.name, f.reused) for f in s.functions] == [("first", True)], s
    assert s.dag_revision == 1, s
    with pytest.raises(sonic.SonicError) as e:
        client.retry("j-0000000000000000")
    assert e.value.status == 404
    # Deleted: gone, and a second delete is a 404.
    client.delete_job(job.id)
    with pytest.raises(sonic.SonicError) as e:
        client.get_job(job.id)
    assert e.value.status == 404
    with pytest.raises(sonic.SonicError) as e:
        client.delete_job(job.id)
    assert e.value.status == 404


def test_wait_times_out_while_the_job_goes_on(client: sonic.Client) -> None:
    dag = sonic.Dag(name("slow")).function(
        "slow", image=IMAGE, command=["synthetic", "run", "--sleep-ms", "60000"], timeout=120
    )
    client.apply(dag)
    job = client.submit(dag)
    try:
        with pytest.raises(TimeoutError):
            job.wait(timeout=1.0)
        assert not client.get_job(job.id).ended
    finally:
        job.cancel()


def test_the_saved_context_and_a_wrong_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server, token = os.environ["SONIC_SERVER"], os.environ["SONIC_TOKEN"]
    monkeypatch.delenv("SONIC_SERVER")
    monkeypatch.delenv("SONIC_TOKEN")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    # No context saved: said so.
    with pytest.raises(sonic.SonicError) as e:
        sonic.Client()
    assert "ofctl up" in e.value.message
    # What `ofctl up` saves.
    cfg = tmp_path / "sonic" / "config.json"
    assert sonic.config_path() == cfg
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"server": server, "token": token}))
    saved = sonic.Client()
    assert saved.server == server.rstrip("/")
    assert isinstance(saved.dags(), list)
    assert token not in repr(saved)
    # SONIC_TOKEN wins over the saved token, and a wrong one is a 401.
    monkeypatch.setenv("SONIC_TOKEN", "not-the-token-0123456789")
    with pytest.raises(sonic.SonicError) as e:
        sonic.Client().jobs()
    assert e.value.status == 401 and e.value.message == "missing or wrong token"
    assert sonic.Client(token=token).health()["status"] == "ok"


def test_unreachable_server() -> None:
    with pytest.raises(sonic.SonicError) as e:
        sonic.Client("http://127.0.0.1:9", token="x" * 16, timeout=5).dags()
    assert e.value.status is None
    assert "cannot reach the control plane at http://127.0.0.1:9" in e.value.message


def test_secrets_set_listed_named_and_deleted(client: sonic.Client) -> None:
    secret = name("key")
    client.set_secret(secret, "py-s3cret-value")
    listed = {s["name"]: s for s in client.secrets()}
    assert listed[secret]["bytes"] == len("py-s3cret-value"), listed
    assert listed[secret]["source"] == "store"
    assert "py-s3cret-value" not in json.dumps(listed)

    # A function names it; its run gets it, its log does not show it.
    dag = sonic.Dag(name("secretive")).function(
        "show",
        image=IMAGE,
        command=["sh", "-c", 'echo "key=$KEY"; test "$KEY" = py-s3cret-value'],
        env={"KEY": {"secret": secret}, "MODE": "x"},
        timeout=60,
    )
    client.apply(dag)
    assert client.dag(dag.name).parsed["functions"][0]["secrets"] == {"KEY": secret}
    summary = client.run(dag, policy="remote")
    assert summary["status"] == "succeeded", summary.get("error")
    logs = client.job(summary["job_id"]).logs("show")
    assert any("key=[secret KEY]" in entry.log for entry in logs), logs
    assert all("py-s3cret-value" not in entry.log for entry in logs), logs

    client.delete_secret(secret)
    with pytest.raises(sonic.SonicError) as e:
        client.delete_secret(secret)
    assert e.value.status == 404
    with pytest.raises(sonic.SonicError) as e:
        client.run(dag, policy="remote")
    assert e.value.status == 400 and f"no secret {secret}" in e.value.message
