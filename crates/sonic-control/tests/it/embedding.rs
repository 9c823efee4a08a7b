//! The example host platform (`examples/host`, the same modules compiled here): the control
//! plane embedded as a library with the host's own resource manager, which starts agents on
//! demand and stops them when idle: `sonic-agent` processes (process sandbox), or containers of
//! the agent image on a network of their own (process sandbox inside). A DAG of the repository
//! (`dags/synthetic-chain.yaml`) runs three profiling jobs, then, once every agent was stopped,
//! a planned job whose grant starts agents again.
//!
//! The container variant needs a Docker engine and the image `sonic-agent-host:latest`
//! (`bash deploy/images/build.sh`, which CI runs before the tests); without them it says so
//! loudly and passes without running (in CI, and with `SONIC_CONTAINER_TESTS=1`, that is a failure).

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use crate::support;
use crate::{containers, on_demand, platform};

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use on_demand::Event;
use serde_json::json;
use sonic_api::control::{JobMode, JobStatus};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `sonic-agent` binary, built now.
fn agent_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let status = std::process::Command::new(&cargo)
            .args(["build", "-p", "sonic-agent", "--bin", "sonic-agent"])
            .current_dir(workspace())
            .status()
            .expect("run cargo to build sonic-agent");
        assert!(status.success(), "`cargo build -p sonic-agent` failed");
        support::lambda_dir().join("sonic-agent")
    })
}

fn started(events: &[Event]) -> Vec<(&str, &str)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Started { agent, why, .. } => Some((agent.as_str(), why.as_str())),
            Event::Stopped { .. } => None,
        })
        .collect()
}

/// The scenario's options: small jobs, a short idle period.
fn scenario(dir: &Path) -> platform::Options {
    platform::Options {
        agent_bin: agent_bin().to_path_buf(),
        lambda_dir: support::lambda_dir().to_path_buf(),
        dir: dir.to_path_buf(),
        dag: std::fs::read_to_string(workspace().join("dags/synthetic-chain.yaml"))
            .expect("dags/synthetic-chain.yaml"),
        params: json!({ "compute_ms": 5, "alloc_mb": 4, "output_bytes": OUTPUT_BYTES }),
        sizes: vec![10_000, 30_000, 50_000],
        idle: Duration::from_millis(300),
        patience: Duration::from_secs(120),
        containers: None,
    }
}

/// What the last function of synthetic-chain writes (`output_bytes`).
const OUTPUT_BYTES: usize = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_starts_agents_on_demand_and_stops_them_when_idle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = scenario(dir.path());
    let out = platform::run(&opts).await.expect("the host runs the DAG");
    check(&out, dir.path()).await;
    assert!(
        out.events.iter().all(|e| !matches!(
            e,
            Event::Started {
                limits: Some(_),
                ..
            }
        )),
        "processes have no container limits: {:?}",
        out.events
    );
    assert!(out.containers.is_none());
}

/// Docker and the agent image, or why not.
async fn docker_with_image(image: &str) -> Result<bollard::Docker, String> {
    let docker = containers::connect(Duration::from_secs(3)).await?;
    containers::check_image(&docker, image).await?;
    Ok(docker)
}

/// Docker with the agent image, or `None` after a loud message (a failure in CI and with
/// `SONIC_CONTAINER_TESTS=1`).
async fn docker_or_skip(image: &str) -> Option<bollard::Docker> {
    match docker_with_image(image).await {
        Ok(d) => Some(d),
        Err(e)
            if support::in_ci()
                || std::env::var("SONIC_CONTAINER_TESTS").is_ok_and(|v| v == "1") =>
        {
            panic!("{e}: build the agent image (bash deploy/images/build.sh) and start Docker")
        }
        Err(e) => {
            eprintln!(
                "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
                 !!! SKIPPED: agents as containers: {e}\n\
                 !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
            );
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_starts_agent_containers_on_demand_and_removes_them_when_idle() {
    let image = containers::DEFAULT_IMAGE;
    let Some(docker) = docker_or_skip(image).await else {
        return;
    };
    let engine_cpus = docker
        .info()
        .await
        .expect("docker info")
        .ncpu
        .expect("ncpu") as u64;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = scenario(dir.path());
    opts.containers = Some(containers::ContainerOptions {
        image: image.into(),
        // The agent of this tree (the image gives the filesystem): a stale image does not
        // test old code.
        agent_bin: Some(agent_bin().to_path_buf()),
        ..containers::ContainerOptions::default()
    });
    let out = platform::run(&opts).await.expect("the host runs the DAG");
    check(&out, dir.path()).await;

    // Every start was a container, limited to its machine's vCPUs (at most the engine's) and
    // memory, as Docker reports them.
    let machines = platform::machines();
    for e in &out.events {
        if let Event::Started { agent, limits, .. } = e {
            let m = machines.iter().find(|m| &m.id == agent).expect("a machine");
            let limits = limits.expect("a container's limits");
            assert_eq!(
                limits.millicpus,
                u64::from(m.vcpus).min(engine_cpus) * 1000,
                "{agent}"
            );
            assert_eq!(limits.memory_mb, m.memory_mb, "{agent}");
        }
    }
    // The agents' logs were kept on the host when their containers were removed, and say
    // they reached the control plane on the gateway: no report push failed.
    for (agent, _) in started(&out.events) {
        let log = dir.path().join("agents").join(agent).join("agent.log");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            text.contains("agent listening"),
            "{}: {text}",
            log.display()
        );
        assert!(!text.contains("report push"), "{}: {text}", log.display());
    }

    // Nothing is left: no container of the run, running or not, and no network.
    let (run, network) = out.containers.clone().expect("a container run");
    assert!(network.starts_with("sonic-host-"), "{network}");
    let left = containers::list_run(&docker, &run)
        .await
        .expect("docker ps");
    assert!(left.is_empty(), "containers left: {left:?}");
    assert!(
        !containers::network_exists(&docker, &network)
            .await
            .expect("network inspect"),
        "the network {network} is left"
    );
}

/// What both variants assert about the scenario's outcome.
async fn check(out: &platform::Outcome, dir: &Path) {
    let events = &out.events;

    // Every job succeeded: three profiling jobs taught the models, the fourth was planned.
    assert_eq!(out.summaries.len(), 4, "{:?}", out.summaries);
    for s in &out.summaries {
        assert_eq!(
            s.status,
            JobStatus::Succeeded,
            "{}: {:?}",
            s.job_id,
            s.error
        );
    }
    let modes: Vec<JobMode> = out.summaries.iter().map(|s| s.mode).collect();
    assert_eq!(
        modes,
        [
            JobMode::Profiling,
            JobMode::Profiling,
            JobMode::Profiling,
            JobMode::Planned
        ]
    );

    // Every job's result is c's output, every byte as the lambda writes it.
    let store = sonic_storage::local::LocalStore::new(dir.join("store")).expect("store");
    for s in &out.summaries {
        assert_eq!(s.outputs.len(), 1, "{}: {:?}", s.job_id, s.outputs);
        let key = s.outputs[0]
            .strip_prefix("store://")
            .unwrap_or_else(|| panic!("{}: {:?}", s.job_id, s.outputs));
        let bytes = sonic_storage::ObjectStore::get_bytes(&store, key)
            .await
            .expect("the job's output");
        let want: Vec<u8> = (0..OUTPUT_BYTES as u64)
            .map(|k| (k.wrapping_mul(31) % 251) as u8)
            .collect();
        assert!(
            bytes[..] == want[..],
            "{}: {key}: {} bytes",
            s.job_id,
            bytes.len()
        );
    }

    // On demand: nothing ran before the first job; its first instance started an agent.
    let first = &out.summaries[0].job_id;
    assert!(
        matches!(&events[0], Event::Started { why, .. } if why == &format!("an instance of job {first}")),
        "{events:?}"
    );
    // Every agent an instance ran on had been started by the host.
    let ever: Vec<&str> = started(events).iter().map(|(a, _)| *a).collect();
    for s in &out.summaries {
        for f in &s.functions {
            assert!(
                ever.contains(&f.agent.as_str()),
                "{} ran on {}",
                f.name,
                f.agent
            );
        }
    }

    // Every agent was stopped before the planned job was submitted, so its grant started the
    // ones it runs on, and the job's summary says so.
    let (before, after) = events.split_at(out.before_planned);
    let mut up: Vec<&str> = Vec::new();
    for e in before {
        match e {
            Event::Started { agent, .. } => up.push(agent),
            Event::Stopped { agent } => up.retain(|a| a != agent),
        }
    }
    assert!(
        up.is_empty(),
        "still running before the planned job: {up:?}"
    );
    let planned = out.summaries.last().expect("planned job");
    let for_planned: Vec<&str> = started(after)
        .into_iter()
        .filter(|(_, why)| *why == format!("job {}", planned.job_id))
        .map(|(a, _)| a)
        .collect();
    let mut ran_on: Vec<&str> = planned.functions.iter().map(|f| f.agent.as_str()).collect();
    ran_on.sort();
    ran_on.dedup();
    let mut granted = for_planned.clone();
    granted.sort();
    assert_eq!(granted, ran_on, "{events:?}");
    let plan = planned
        .plan
        .as_ref()
        .expect("a planned job records its grant");
    assert!(
        plan.notes
            .iter()
            .any(|n| n == &format!("started on demand: {}", for_planned.join(", "))),
        "{:?}",
        plan.notes
    );

    // Idle agents were stopped: as many stops as starts, the last event a stop, none running.
    let stops = events
        .iter()
        .filter(|e| matches!(e, Event::Stopped { .. }))
        .count();
    assert_eq!(stops, started(events).len(), "{events:?}");
    assert!(
        matches!(events.last(), Some(Event::Stopped { .. })),
        "{events:?}"
    );
    assert!(out.running_at_end.is_empty(), "{:?}", out.running_at_end);
}

/// a -> b over `vm-storage`, a on `vms` VMs of `vm_type`.
fn offer(vm_type: &str, vms: u32) -> sonic_control::resources::Offer {
    use sonic_core::model::Method;
    use sonic_core::planner::{Plan, PlanEdge, PlanStage, Predicted};
    let dag = sonic_core::dag::Dag::from_yaml(
        "pair.yaml",
        r#"
name: pair
functions:
  - { name: a, image: i, command: [x], instances: 2 }
  - { name: b, image: i, command: [x], instances: 2 }
edges:
  - { from: a, to: b, kind: one }
"#,
    )
    .expect("dag");
    let stage = |function: &str| PlanStage {
        cores: 1.0,
        function: function.into(),
        vm_type: vm_type.into(),
        vms,
        per_vm: 1,
        concurrent: 1,
        warm: false,
        prewarmed: false,
    };
    let agents = platform::machines()
        .into_iter()
        .map(|m| sonic_control::store::AgentSlot {
            vcpus: None,
            id: m.id,
            url: String::new(),
            vm_type: m.vm_type,
        })
        .collect();
    sonic_control::resources::Offer {
        job: "j-pair".into(),
        dag: std::sync::Arc::new(dag),
        plan: Plan {
            stages: vec![stage("a"), stage("b")],
            edges: vec![PlanEdge {
                from: "a".into(),
                to: "b".into(),
                method: Method::VmStorage,
                predicted_s: 0.0,
            }],
            predicted: Predicted {
                latency_s: 1.0,
                cost_usd: 1.0,
                perf_per_dollar: 1.0,
                requests_usd: 0.0,
                latency_quantiles_s: None,
            },
            timing: Vec::new(),
        },
        second_best: None,
        memory_limit_mb: vec![512, 512],
        agents,
        prefer: Vec::new(),
        warm: Default::default(),
        share: false,
    }
}

fn manager(dir: &Path) -> on_demand::OnDemand {
    on_demand::OnDemand::new(
        platform::machines(),
        on_demand::Launcher {
            agent_bin: agent_bin().to_path_buf(),
            lambda_dirs: vec![support::lambda_dir().to_path_buf()],
            data_dir: dir.join("agents"),
            store_dir: dir.join("store"),
            agent_token: "agent-token-0123456789abcdef".into(),
            file_key: "file-key-0123456789abcdef".into(),
            start_timeout: Duration::from_secs(30),
            containers: None,
        },
        Duration::from_secs(3600),
    )
    .expect("manager")
}

#[tokio::test]
async fn a_plan_wanting_more_machines_than_the_inventory_gets_its_capacity_and_starts_nothing() {
    use sonic_control::resources::{Answer, ResourceManager};
    let dir = tempfile::tempdir().expect("tempdir");
    let m = manager(dir.path());
    let answer = m
        .offer(&offer("m5.xlarge", 2), &|_| {})
        .await
        .expect("answer");
    let Answer::Capacity { vms, why } = answer else {
        panic!("not a capacity answer: {answer:?}");
    };
    assert_eq!(
        vms.into_iter().collect::<Vec<_>>(),
        [("m5.large".to_owned(), 2), ("m5.xlarge".to_owned(), 1)]
    );
    assert!(
        why.contains("a wants 2 m5.xlarge VMs, the host has 1"),
        "{why}"
    );
    assert!(m.events().is_empty(), "{:?}", m.events());
    assert!(m.running().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_starts_distinct_machines_and_gives_a_vm_storage_receiver_its_senders() {
    use sonic_control::resources::{Answer, ResourceManager};
    let dir = tempfile::tempdir().expect("tempdir");
    let m = manager(dir.path());
    let said = std::sync::Mutex::new(Vec::<String>::new());
    let answer = m
        .offer(&offer("m5.large", 2), &|why| {
            said.lock().unwrap().push(why.to_owned())
        })
        .await
        .expect("answer");
    let Answer::Grant(grant) = answer else {
        panic!("not a grant: {answer:?}");
    };
    let pair = vec!["host-1".to_owned(), "host-2".to_owned()];
    assert_eq!(grant.hosts, vec![pair.clone(), pair.clone()]);
    assert_eq!(grant.notes, ["started on demand: host-1, host-2"]);
    assert_eq!(
        *said.lock().unwrap(),
        ["starting agents host-1, host-2 on demand"]
    );
    assert_eq!(m.running(), pair);
    // Offered again while held: the same machines, already running, nothing started.
    let again = m
        .offer(&offer("m5.large", 2), &|_| {})
        .await
        .expect("answer");
    assert!(
        matches!(&again, Answer::Grant(g) if g.hosts == grant.hosts && g.notes.is_empty()),
        "{again:?}"
    );
    assert_eq!(started(&m.events()).len(), 2, "{:?}", m.events());
    m.release("j-pair");
    m.release("j-pair");
    m.stop_all().await;
    assert!(m.running().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_not_cleaned_up_are_removed_with_their_network_when_dropped() {
    let image = containers::DEFAULT_IMAGE;
    let Some(docker) = docker_or_skip(image).await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let c = containers::Containers::setup(containers::ContainerOptions {
        image: image.into(),
        agent_bin: Some(agent_bin().to_path_buf()),
        ..containers::ContainerOptions::default()
    })
    .await
    .expect("setup");
    let (run, network) = (c.run.clone(), c.network.clone());
    let agent = containers::AgentContainer {
        id: "host-1".into(),
        ip: c.address(0).expect("an address"),
        vm_type: "m5.large".into(),
        vcpus: 2,
        memory_mb: 512,
        data_dir: dir.path().join("agent"),
        store_dir: dir.path().join("store"),
        lambda_dirs: vec![support::lambda_dir().to_path_buf()],
        agent_token: "agent-token-0123456789abcdef".into(),
        file_key: "file-key-0123456789abcdef".into(),
    };
    std::fs::create_dir_all(&agent.store_dir).expect("store");
    let name = c.start(&agent).await.expect("a container starts");
    assert_eq!(
        containers::list_run(&docker, &run)
            .await
            .expect("docker ps"),
        [name]
    );
    assert!(
        containers::network_exists(&docker, &network)
            .await
            .expect("inspect")
    );
    // Dropped without `cleanup` (as when the host fails on its way): the guard removes both.
    drop(c);
    let left = containers::list_run(&docker, &run)
        .await
        .expect("docker ps");
    assert!(left.is_empty(), "containers left: {left:?}");
    assert!(
        !containers::network_exists(&docker, &network)
            .await
            .expect("inspect"),
        "the network {network} is left"
    );
}
