//! The daemons as they run on real hosts, in-process: a control plane started from its own
//! configuration only (`sonic_control::start`: its store, its generated agent token and file key),
//! serving HTTPS with a certificate of `deploy/certs.sh`; agents that know only its URL, the join
//! token and the CA (`sonic_agent::start_from_config`), serving HTTPS themselves. A job runs under
//! every policy with `direct` files crossing between the agents over TLS; wrong credentials and
//! untrusting clients are refused.

use serde_json::{Value, json};
use sonic_api::control::{AgentList, JobStatus, JobSummary};
use sonic_control::RunningControl;

use crate::support::{Cluster, JOIN, TOKEN, base64, certificates, sized_input};

const DAG: &str = r#"
name: fan
functions:
  - { name: gen, image: sonic-lambdas:latest, command: [synthetic, copy, --to, mid], timeout: 30s }
  - { name: mid, image: sonic-lambdas:latest, command: [synthetic, copy, --to, sink], instances: 2, timeout: 30s }
  - { name: sink, image: sonic-lambdas:latest, command: [synthetic, copy, --to, result], timeout: 30s }
edges:
  - { from: gen, to: mid, kind: broadcast }
  - { from: mid, to: sink, kind: gather }
"#;

/// Two m5.large agents joining a control plane started from its configuration, all over TLS,
/// the store SeaweedFS's sonic-standalone bucket (else a folder); what the set-up checks: both
/// serve HTTPS, the agents had no token nor file key of their own and received the file key,
/// and the control plane lists them alive at their HTTPS addresses.
async fn cluster() -> Cluster {
    let c = Cluster::builder()
        .agents(&[("a-1", "m5.large"), ("a-2", "m5.large")])
        .tls()
        .store_bucket("sonic-standalone")
        .start()
        .await;
    assert!(c.url().starts_with("https://"), "{}", c.url());
    for agent in &c.agents {
        let id = &agent.state.config.id;
        let cfg = c.joined_agent_config(id, "m5.large", &c.dir().join(id));
        // It has no token and no file key of its own: both come from joining.
        assert!(cfg.token.is_empty() && cfg.file_key.is_empty());
        assert!(agent.url().starts_with("https://"), "{}", agent.url());
        assert_eq!(agent.state.config.file_key.len(), 32, "file key received");
    }
    let list: AgentList =
        serde_json::from_value(c.get_json_status("/v1/agents").await.1).expect("json");
    assert!(list.agents.len() == 2 && list.agents.iter().all(|a| a.alive));
    assert!(list.agents.iter().all(|a| a.url.starts_with("https://")));
    c
}

impl Cluster {
    async fn run_fan(&self, policy: &str, input: &[u8]) -> (Value, JobSummary) {
        self.run(json!({
            "dag": "fan",
            "policy": policy,
            "input": { "name": "data.bin", "base64": base64(input) },
        }))
        .await
    }
}

#[tokio::test]
async fn joined_agents_run_a_job_under_every_policy_over_tls() {
    let c = cluster().await;
    c.apply(DAG).await;
    let input = sized_input(300_000);
    let mut all = Vec::new();
    for policy in ["direct", "remote", "local"] {
        let (v, s) = c.run_fan(policy, &input).await;
        assert_eq!(s.status, JobStatus::Succeeded, "{policy}: {v}");
        let method = if policy == "local" {
            "vm-storage"
        } else {
            policy
        };
        assert!(s.edges.iter().all(|e| e.method.as_str() == method), "{v}");
        let agents: std::collections::BTreeSet<&str> =
            s.functions.iter().map(|f| f.agent.as_str()).collect();
        if policy == "direct" {
            // direct files crossed between the two agents, over their TLS file servers.
            assert_eq!(agents.len(), 2, "direct spreads over both agents: {v}");
        }
        let files = c.results(&s).await;
        assert_eq!(files.len(), 2, "{v}");
        assert!(
            files.iter().all(|(_, d)| d == &input),
            "{policy}: results differ from the input"
        );
        all.push(files);
    }
    assert_eq!(all[0], all[1], "direct and remote results differ");
    assert_eq!(all[0], all[2], "direct and local results differ");
    c.stop().await;
}

#[tokio::test]
async fn wrong_credentials_and_untrusting_clients_are_refused() {
    let c = cluster().await;
    let dir = tempfile::tempdir().expect("tempdir");

    // An agent with a wrong join token is refused and does not start.
    certificates(&c.certs(), &["a-3"]);
    let mut cfg = c.joined_agent_config("a-3", "m5.large", &dir.path().join("a-3"));
    cfg.join_token = "wrong-join-token-0123456789".into();
    let err = sonic_agent::start_from_config(cfg)
        .await
        .expect_err("a wrong join token is refused");
    assert!(err.to_string().contains("401"), "{err}");

    // An agent that does not trust the control plane's certificate stops with a clear error
    // instead of retrying for ever.
    let other = dir.path().join("other-ca");
    certificates(&other, &["x"]);
    let mut cfg = c.joined_agent_config("a-3", "m5.large", &dir.path().join("a-3"));
    cfg.ca_file = Some(other.join("ca.pem"));
    let err = sonic_agent::start_from_config(cfg)
        .await
        .expect_err("an untrusted control plane is refused");
    assert!(err.to_string().contains("certificate"), "{err}");

    // The join token opens the agent routes only, never the API.
    for (path, token) in [
        ("/v1/agents", JOIN),
        ("/v1/dags", JOIN),
        ("/v1/jobs", "nope"),
    ] {
        let r = c
            .http
            .get(c.url_for(path))
            .bearer_auth(token)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 401, "{path} with {token}");
    }

    // A client that does not trust the cluster's CA cannot talk to the control plane or to an
    // agent, token or not.
    let untrusting = reqwest::Client::new();
    for url in [
        c.url_for("/v1/health"),
        format!("{}/v1/health", c.agents[0].url()),
    ] {
        let e = untrusting
            .get(&url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect_err("an untrusted certificate is refused");
        assert!(e.is_connect(), "{url}: {e}");
    }
    // Another CA's client is refused just the same.
    let foreign = sonic_daemon::tls::client_builder(Some(&other.join("ca.pem")))
        .expect("CA")
        .build()
        .expect("client");
    assert!(foreign.get(c.url_for("/v1/health")).send().await.is_err());
    // Plain HTTP to the TLS port gets nothing useful.
    let plain = c.url().replacen("https://", "http://", 1);
    let r = reqwest::Client::new()
        .get(format!("{plain}/v1/agents"))
        .bearer_auth(TOKEN)
        .send()
        .await;
    assert!(r.map(|r| !r.status().is_success()).unwrap_or(true));
    c.stop().await;
}

#[tokio::test]
async fn a_restarted_control_plane_hands_out_the_same_secrets() {
    // Started from its configuration alone (no agents, no store configured), then again on
    // the same data folder.
    let c = Cluster::builder().joined().agents(&[]).start().await;
    let secrets = |c: &RunningControl| {
        c.state
            .jobs
            .as_ref()
            .expect("a standalone control plane runs jobs")
            .join_secrets()
    };
    let before = secrets(c.control());
    // No store configured: the fallback folder in the data folder, said so.
    assert_eq!(
        before.store,
        Some(sonic_api::control::StoreSpec::Local {
            root: c.dir().join("control/store").display().to_string()
        })
    );
    let c = c.restart().await;
    assert_eq!(
        secrets(c.control()),
        before,
        "same agent token and file key after a restart"
    );
    c.stop().await;
}
