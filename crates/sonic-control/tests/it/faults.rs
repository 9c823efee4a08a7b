//! Agent loss: the three applications run under `direct` (every edge a VM-to-VM copy, so a lost
//! agent takes files the next stage needs) on agents that are processes of their own (this test
//! binary re-run as a whole agent, the kit's `agent_processes`; process sandbox, one shared
//! local store). For each application and each of its stages, one agent is
//! killed with SIGKILL while the job's event stream says that stage runs; the job must succeed
//! with results byte-identical to an undisturbed run. A replacement agent joins after each kill.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sonic_api::control::{JobEvent, JobLogs, JobStatus};
use sonic_core::units::{ByteSize, Seconds};
use sonic_storage::ObjectStore;
use sonic_storage::s3::{S3Config, S3Store};
use sonic_testkit::lambda_dir as bin_dir;

use crate::support::{Builder, Cluster, base64, dag_file};

/// `n` m5.large agent processes (`a-01`, ...) heartbeating every second, a killed one dropping
/// out of the list after 4 s; no catalog; job inputs up to 256 MiB inline; a job ends within
/// 240 s.
fn cluster(n: u32) -> Builder {
    let ids: Vec<String> = (1..=n).map(|i| format!("a-{i:02}")).collect();
    let agents: Vec<(&str, &str)> = ids.iter().map(|id| (id.as_str(), "m5.large")).collect();
    Cluster::builder()
        .agents(&agents)
        .agent_processes()
        .catalog(None)
        .heartbeat_timeout(Seconds(4.0))
        .max_body(ByteSize(256 << 20))
        .wait_deadline(Duration::from_secs(240))
}

fn tool(bin: &str, args: &[&str]) {
    let out = Command::new(bin_dir().join(bin))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e}"));
    assert!(
        out.status.success(),
        "{bin} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A job of `dag` on the file `input` under `policy`.
fn job(dag: &str, input: &Path, params: &Value, policy: &str) -> Value {
    let bytes = std::fs::read(input).unwrap();
    let name = input.file_name().unwrap().to_str().unwrap();
    json!({
        "dag": dag,
        "policy": policy,
        "params": params,
        "input": { "name": name, "base64": base64(&bytes) },
    })
}

impl Cluster {
    /// Atomic visibility, as the agents checked it: in the job's logs, every receiving stage has
    /// instances that started after their inputs' sizes matched the senders' (the agent writes
    /// that line before the lambda's log), and no instance found an input incomplete.
    async fn assert_inputs_checked(&self, id: &str, receivers: &[&str]) {
        let (_, logs) = self.get_json_status(&format!("/v1/jobs/{id}/logs")).await;
        let logs: JobLogs = serde_json::from_value(logs).expect("logs");
        for l in &logs.logs {
            assert!(
                !l.log.contains("the instance was not started"),
                "{id}: {} {} started with an incomplete input: {}",
                l.function,
                l.instance,
                l.log
            );
        }
        for stage in receivers {
            assert!(
                logs.logs.iter().any(|l| l.function == *stage
                    && l.log
                        .contains("inputs complete before the start (sizes checked)")),
                "{id}: no {stage} instance reports its inputs checked: {logs:?}"
            );
        }
    }

    /// Follows the job's events until `stage` shows up (true) or the job ends (false).
    async fn wait_stage(&self, id: &str, name: &str) -> bool {
        let mut events = self.events(id).await;
        while let Some(e) = events.next().await {
            if e.stage.as_deref() == Some(name) {
                return true;
            }
        }
        false
    }

    /// Follows the job's events; when `stage` shows up, kills the agent that runs its first
    /// instance under `direct` (placement `(stage + k) % agents` over the ids in order). Returns
    /// every event seen and the id killed (None if the stage was never seen running).
    async fn kill_during(
        &mut self,
        id: &str,
        stage: usize,
        name: &str,
    ) -> (Vec<JobEvent>, Option<String>) {
        let mut stream = self.events(id).await;
        assert_eq!(stream.status, 200);
        let ids: Vec<String> = self.alive().await;
        let victim = ids[stage % ids.len()].clone();
        let mut killed = None;
        let mut events = Vec::new();
        while let Some(e) = stream.next().await {
            if killed.is_none() && e.stage.as_deref() == Some(name) {
                self.kill_agent(&victim);
                killed = Some(victim.clone());
            }
            events.push(e);
        }
        (events, killed)
    }
}

struct App {
    file: &'static str,
    dag: &'static str,
    stages: [&'static str; 3],
    input: PathBuf,
    params: Value,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_agent_in_any_stage_of_any_application_changes_no_result() {
    let mut c = cluster(3).start().await;
    let dir = c.dir().join("inputs");
    std::fs::create_dir_all(&dir).unwrap();
    let path = |n: &str| dir.join(n).display().to_string();
    tool(
        "sonic-gen",
        &[
            "sort",
            "--bytes",
            "4000000",
            "--seed",
            "7",
            "--out",
            &path("records.bin"),
        ],
    );
    tool(
        "sonic-gen",
        &[
            "ml",
            "--rows",
            "4000",
            "--seed",
            "3",
            "--out",
            &path("data.csv"),
        ],
    );
    tool(
        "sonic-gen",
        &[
            "video",
            "--seconds",
            "40",
            "--seed",
            "5",
            "--out",
            &path("video.y4m"),
            "--truth",
            &path("truth.json"),
        ],
    );
    let apps = [
        App {
            file: "mapreduce-sort.yaml",
            dag: "mapreduce-sort",
            stages: ["split", "map", "reduce"],
            input: dir.join("records.bin"),
            params: json!({ "mappers": 3, "reducers": 3 }),
        },
        App {
            file: "ml-pipeline.yaml",
            dag: "ml-pipeline",
            stages: ["pca", "train", "combine"],
            input: dir.join("data.csv"),
            params: json!({ "trees": 3 }),
        },
        App {
            file: "video-analytics.yaml",
            dag: "video-analytics",
            stages: ["split", "extract", "classify"],
            input: dir.join("video.y4m"),
            params: json!({}),
        },
    ];
    let mut report = Vec::new();
    for app in &apps {
        c.apply(&dag_file(app.file)).await;
        let id = c
            .submit(job(app.dag, &app.input, &app.params, "direct"))
            .await;
        let undisturbed = c.wait(&id).await;
        assert_eq!(
            undisturbed.status.to_string(),
            "succeeded",
            "{}: {:?}",
            app.dag,
            undisturbed.error
        );
        let want = c.stored_results(&undisturbed).await;
        assert!(!want.is_empty(), "{} has results", app.dag);
        let mut recovered = 0;
        for (stage, name) in app.stages.iter().enumerate() {
            let id = c
                .submit(job(app.dag, &app.input, &app.params, "direct"))
                .await;
            let (events, killed) = c.kill_during(&id, stage, name).await;
            let s = c.wait(&id).await;
            let killed = killed.unwrap_or_else(|| panic!("{}: stage {name} never ran", app.dag));
            assert_eq!(
                s.status.to_string(),
                "succeeded",
                "{} with {killed} killed during {name}: {:?}",
                app.dag,
                s.error
            );
            assert_eq!(
                c.stored_results(&s).await,
                want,
                "{}: results after killing {killed} during {name} differ",
                app.dag
            );
            c.assert_inputs_checked(&id, &app.stages[1..]).await;
            let again = events.iter().any(|e| {
                e.message
                    .as_deref()
                    .is_some_and(|m| m.contains(&format!("agent {killed} lost")))
            });
            if again {
                recovered += 1;
            }
            report.push(format!(
                "{} {name}: killed {killed}, {}",
                app.dag,
                if again {
                    "ran again without it"
                } else {
                    "not needed again"
                }
            ));
            // A fresh agent replaces the dead one before the next kill.
            c.add_agent().await;
            c.wait_alive().await;
        }
        assert!(
            recovered >= 1,
            "{}: no kill made the job run again: {report:?}",
            app.dag
        );
    }
    eprintln!("{}", report.join("\n"));
    c.stop().await;
}

/// Unmounts a test's tmpfs however the test ends.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// An agent whose disk is full (its data directory is a 2 MiB tmpfs, so writes fail with ENOSPC
/// for real) fails the instances placed on it with that reason, and the job runs again without
/// it, with the results of an undisturbed run. Needs root (mount), as `.ci/run` has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_instance_and_the_job_runs_elsewhere() {
    let mut c = cluster(2).start().await;
    let dir = c.dir().join("inputs");
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("records.bin");
    tool(
        "sonic-gen",
        &[
            "sort",
            "--bytes",
            "6000000",
            "--seed",
            "11",
            "--out",
            input.to_str().unwrap(),
        ],
    );
    c.apply(&dag_file("mapreduce-sort.yaml")).await;
    let params = json!({ "mappers": 3, "reducers": 3 });
    let id = c
        .submit(job("mapreduce-sort", &input, &params, "direct"))
        .await;
    let undisturbed = c.wait(&id).await;
    assert_eq!(
        undisturbed.status,
        JobStatus::Succeeded,
        "{:?}",
        undisturbed.error
    );
    let want = c.stored_results(&undisturbed).await;

    let small = c.dir().join("small");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&small)
        .output()
        .expect("run mount");
    assert!(
        mounted.status.success(),
        "this test mounts a small tmpfs to fill an agent's disk and needs root: {}",
        String::from_utf8_lossy(&mounted.stderr)
    );
    let _mount = Mount(small.clone());
    let full = c.add_agent_at(small).await;
    c.wait_alive().await;

    let id = c
        .submit(job("mapreduce-sort", &input, &params, "direct"))
        .await;
    let s = c.wait(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    assert_eq!(
        c.stored_results(&s).await,
        want,
        "results with a full disk differ"
    );
    let (_, logs) = c.get_json_status(&format!("/v1/jobs/{id}/logs")).await;
    let text = logs.to_string().to_ascii_lowercase();
    assert!(
        text.contains(&full) && text.contains("no space left on device"),
        "the logs name the full agent and the reason: {logs}"
    );
    c.stop().await;
}

/// A TCP forwarder standing between the cluster and the S3 server: taking it down refuses new
/// connections and cuts open ones, as a store that went away would.
struct Outage {
    addr: SocketAddr,
    up: Arc<std::sync::atomic::AtomicBool>,
    cut: Arc<tokio::sync::Notify>,
    refused: Arc<std::sync::atomic::AtomicU32>,
}

impl Outage {
    async fn start(upstream: String) -> Outage {
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let cut = Arc::new(tokio::sync::Notify::new());
        let refused = Arc::new(AtomicU32::new(0));
        let (up2, cut2, refused2) = (up.clone(), cut.clone(), refused.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if !up2.load(Ordering::SeqCst) {
                    refused2.fetch_add(1, Ordering::SeqCst);
                    drop(inbound);
                    continue;
                }
                let (upstream, cut) = (upstream.clone(), cut2.clone());
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.notified() => {}
                    }
                });
            }
        });
        Outage {
            addr,
            up,
            cut,
            refused,
        }
    }

    fn down(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        self.cut.notify_waiters();
    }

    fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The object store goes away during a `remote` job: for 2 s (shorter than the 6 s the agents
/// and the control plane wait out), the job completes with the undisturbed results; for good,
/// the job fails with an error naming the store. Needs the S3 server of `.ci/run`
/// (`SONIC_S3_ENDPOINT`, default http://127.0.0.1:8333).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_store_outage_is_waited_out_or_fails_the_job_clearly() {
    use std::sync::atomic::Ordering;
    let endpoint =
        std::env::var("SONIC_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:8333".into());
    let upstream = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let outage = Outage::start(upstream).await;
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    let mut cfg = S3Config::new(
        format!("http://{}", outage.addr),
        // The shared bucket (SeaweedFS makes new buckets slowly); job keys are unique.
        env("SONIC_S3_BUCKET", "sonic"),
        env("SONIC_S3_ACCESS_KEY", "sonic"),
        env("SONIC_S3_SECRET_KEY", "sonicsecret"),
    );
    cfg.outage_window_ms = 6_000;
    cfg.max_attempts = 2;
    let raw = S3Store::new(cfg.clone()).expect("s3 store");
    raw.ensure_bucket().await.unwrap_or_else(|e| {
        panic!("this test needs the S3 server at {endpoint} (bash deploy/seaweedfs.sh start): {e}")
    });
    let store: Arc<dyn ObjectStore> = Arc::new(cfg.patient(raw));
    let c = cluster(2).store(store, Some(cfg.clone())).start().await;
    let input = c.dir().join("records.bin");
    tool(
        "sonic-gen",
        &[
            "sort",
            "--bytes",
            "3000000",
            "--seed",
            "13",
            "--out",
            input.to_str().unwrap(),
        ],
    );
    c.apply(&dag_file("mapreduce-sort.yaml")).await;
    let params = json!({ "mappers": 3, "reducers": 2 });
    let mut jobs = Vec::new();
    let id = c
        .submit(job("mapreduce-sort", &input, &params, "remote"))
        .await;
    jobs.push(id.clone());
    let undisturbed = c.wait(&id).await;
    assert_eq!(
        undisturbed.status,
        JobStatus::Succeeded,
        "{:?}",
        undisturbed.error
    );
    let want = c.stored_results(&undisturbed).await;

    // A 2 s outage while the mappers run: waited out.
    let id = c
        .submit(job("mapreduce-sort", &input, &params, "remote"))
        .await;
    jobs.push(id.clone());
    assert!(c.wait_stage(&id, "map").await, "the map stage ran");
    outage.down();
    tokio::time::sleep(Duration::from_secs(2)).await;
    outage.restore();
    let s = c.wait(&id).await;
    assert_eq!(s.status, JobStatus::Succeeded, "{:?}", s.error);
    assert_eq!(
        c.stored_results(&s).await,
        want,
        "results after an outage differ"
    );
    let refused = outage.refused.load(Ordering::SeqCst);
    assert!(
        refused > 0,
        "the outage refused no connection: it did not hit the job"
    );

    // Down for good from the map stage on: the job fails, naming the store.
    let id = c
        .submit(job("mapreduce-sort", &input, &params, "remote"))
        .await;
    jobs.push(id.clone());
    assert!(c.wait_stage(&id, "map").await, "the map stage ran");
    outage.down();
    let s = c.wait(&id).await;
    assert_eq!(s.status, JobStatus::Failed);
    let error = s.error.clone().unwrap_or_default();
    assert!(
        error.contains("did not answer") && error.contains(&outage.addr.to_string()),
        "the job's error names the store and the wait: {error}"
    );
    outage.restore();
    c.stop().await;
    let raw = S3Store::new(cfg).expect("s3 store");
    for id in jobs {
        let _ = raw.delete_prefix(&format!("jobs/{id}/")).await;
    }
}

/// The control plane is killed (SIGKILL) while a job runs, and started again on the same
/// database: the job goes on from what was recorded and succeeds with an undisturbed run's
/// results; the DAG, the earlier job with its summary and results, its profiling sample and the
/// models are all still there; the agents are heard again and a new job succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_killed_mid_job_loses_nothing() {
    let mut c = cluster(2).control_process().start().await;
    let input = c.dir().join("records.bin");
    tool(
        "sonic-gen",
        &[
            "sort",
            "--bytes",
            "4000000",
            "--seed",
            "17",
            "--out",
            input.to_str().unwrap(),
        ],
    );
    c.apply(&dag_file("mapreduce-sort.yaml")).await;
    let body = job(
        "mapreduce-sort",
        &input,
        &json!({ "mappers": 3, "reducers": 2 }),
        "direct",
    );
    // The models of the jobs' own parameter setting (models are learned per setting).
    const MODELS: &str =
        "/v1/dags/mapreduce-sort/models?params=%7B%22mappers%22%3A3%2C%22reducers%22%3A2%7D";
    let first = c.submit(body.clone()).await;
    let (before, before_s) = c.ended(&first).await;
    assert_eq!(before["status"], "succeeded", "{before}");
    let (_, models_before) = c.get_json_status(MODELS).await;
    let samples = |m: &Value| m["samples"].as_array().map_or(0, Vec::len);
    assert_eq!(samples(&models_before), 1, "{models_before}");

    // A second job; the control plane is killed while its mappers run.
    let second = c.submit(body.clone()).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, v) = c.get_json_status(&format!("/v1/jobs/{second}")).await;
        if v["status"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "job {second} never ran: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c = c.restart().await;

    // The job goes on from what the killed process recorded, to the same results.
    let (after, after_s) = c.ended(&second).await;
    assert_eq!(after["status"], "succeeded", "{after}");
    assert_eq!(
        c.stored_results(&after_s).await,
        c.stored_results(&before_s).await,
        "the resumed job's results differ from an undisturbed run's"
    );
    let (status, dags) = c.get_json_status("/v1/dags").await;
    assert_eq!(status, 200);
    assert!(dags.to_string().contains("mapreduce-sort"), "{dags}");
    let (_, first_again) = c.get_json_status(&format!("/v1/jobs/{first}")).await;
    assert_eq!(first_again["status"], "succeeded");
    assert_eq!(
        first_again["outputs"], before["outputs"],
        "the earlier job's results are kept"
    );
    assert!(
        models_before["models"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "models were fitted: {models_before}"
    );
    // The first job's sample survived, and the resumed job added its own.
    let (_, models_after) = c.get_json_status(MODELS).await;
    assert_eq!(samples(&models_after), 2, "{models_after}");
    for out in before["outputs"].as_array().expect("outputs") {
        let key = out.as_str().unwrap().strip_prefix("store://").unwrap();
        assert!(
            c.store().head(key).await.unwrap().is_some(),
            "result {key} is kept"
        );
    }

    // The agents are heard again, and a new job succeeds with the same results.
    c.wait_alive().await;
    let third = c.submit(body).await;
    let (done, _) = c.ended(&third).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let (_, models_last) = c.get_json_status(MODELS).await;
    assert_eq!(samples(&models_last), 3, "the new job adds its sample");
    c.stop().await;
}
