//! Job decisions without a network: how each edge moves data under a policy, where each instance of
//! a stage runs, and the [`RunRequest`] every instance gets (the file ABI's input and output layout).
//!
//! The executor ([`crate::exec`]) calls [`stage_runs`] once per stage, after the stages before
//! it ended, because a `scatter` receiver's fanout is only known from what its sender wrote.

use std::collections::BTreeMap;

use sonic_api::agent::{FileSource, HandlerRun, InputSpec, OutputRoute, RunRequest};
use sonic_core::dag::{Dag, EdgeKind, Fanout};

pub use crate::learn::DEFAULT_MEMORY_MB;
pub use crate::learn::warm::function_key;
use crate::store::AgentSlot;

// One vocabulary: the policies and the data-passing methods are sonic-core's.
pub use sonic_core::model::Method;
pub use sonic_core::planner::Policy;

/// The method of every edge (by edge index) under a fixed policy. `sonic` without a usable plan
/// profiles: every edge goes through the store, which measures each function on its own.
pub fn edge_methods(dag: &Dag, policy: Policy) -> Vec<Method> {
    let m = match policy {
        Policy::Remote | Policy::Sonic | Policy::SonicMean | Policy::Oracle => Method::Remote,
        Policy::Direct => Method::Direct,
        Policy::Local => Method::VmStorage,
        Policy::Memory => Method::Memory,
    };
    vec![m; dag.edges.len()]
}

/// One file an instance wrote, and where it now is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Produced {
    /// The writer's instance index.
    pub instance: u32,
    /// The downstream function (or `result`) it was written for.
    pub to: String,
    /// The file's name.
    pub name: String,
    /// Its path in the job's namespace on the writer's agent.
    pub file_path: String,
    /// Index into the job's agents of the writer's agent.
    pub agent: usize,
    /// The object key when it was uploaded.
    pub key: Option<String>,
    /// The upload went to the in-memory tier (else, with a key, the object store).
    pub in_memory: bool,
    /// Its size, bytes.
    pub size: u64,
}

/// A job input file in the object store, staged as `input/<name>` for the first functions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInputFile {
    /// The name under `input/`.
    pub name: String,
    /// The object's key in the store.
    pub key: String,
}

/// Everything a stage's requests depend on.
#[derive(Debug, Clone, Copy)]
pub struct StageContext<'a> {
    /// The job.
    pub job_id: &'a str,
    /// Its DAG.
    pub dag: &'a Dag,
    /// The job's parameters (the DAG's, overridden by the job's).
    pub params: &'a serde_json::Map<String, serde_json::Value>,
    /// Per function: its instances, or scattered (known when its sender ends).
    pub fanouts: &'a [Fanout],
    /// Per DAG edge: how its data moves.
    pub methods: &'a [Method],
    /// The job's policy.
    pub policy: Policy,
    /// The agents the job may use; indices elsewhere point into this.
    pub agents: &'a [AgentSlot],
    /// What every earlier function wrote, by function index (empty for later ones).
    pub produced: &'a [Vec<Produced>],
    /// The job's input files.
    pub inputs: &'a [JobInputFile],
    /// The key the agents check `direct` file tokens with, and the tokens' expiry (Unix seconds).
    pub file_key: &'a [u8],
    /// When the `direct` file tokens expire, Unix seconds.
    pub token_expiry: u64,
    /// The handler of each function that runs one, by function index
    /// ([`crate::exec::handlers::resolve`]).
    pub handlers: &'a BTreeMap<usize, HandlerRun>,
    /// The values of the secrets the DAG's functions name, by secret name
    /// ([`crate::exec::secrets::resolve`]).
    pub secrets: &'a BTreeMap<String, String>,
}

/// No secrets: a [`StageContext`]'s for a DAG that names none.
pub static NO_SECRETS: BTreeMap<String, String> = BTreeMap::new();

/// One instance to start: on which agent, with what request.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// Index into the job's agents.
    pub agent: usize,
    /// What the agent is asked to run.
    pub request: RunRequest,
}

/// Why a stage cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No agent to place the stage on.
    #[error("no alive agent to run on")]
    NoAgents,
    /// A scattered stage got no file: nothing to run.
    #[error("function {0}: no instances to run (its scatter sender wrote no file for it)")]
    Empty(String),
    /// An edge's data cannot reach its receivers as asked.
    #[error("edge {from} -> {to}: {why}")]
    Edge {
        /// The sending function.
        from: String,
        /// The receiving function.
        to: String,
        /// Why.
        why: String,
    },
}

/// The object-store prefix of a job's files.
pub fn job_prefix(job: &str) -> String {
    format!("jobs/{job}/")
}

/// Where a job's results are uploaded: `jobs/<job>/result`, with `<function>/<instance>` below it
/// when more than one instance could write the same name.
pub fn result_prefix(job: &str, dag: &Dag, function: usize, instance: u32, fanout: u32) -> String {
    let single_sink = dag.sinks().len() == 1 && dag.sinks()[0] == function && fanout == 1;
    if single_sink {
        format!("jobs/{job}/result")
    } else {
        format!(
            "jobs/{job}/result/{}/{instance}",
            dag.functions[function].name
        )
    }
}

/// How many instances function `i` runs: its known fanout, for a scatter receiver the number of
/// files its sender wrote for it, and for a one edge's receiver its sender's count.
pub fn stage_fanout(ctx: &StageContext<'_>, i: usize) -> u32 {
    match ctx.fanouts.get(i) {
        Some(Fanout::Known(n)) => *n,
        _ => {
            let name = &ctx.dag.functions[i].name;
            if let Some(e) = ctx.dag.incoming(i).find(|e| e.kind == EdgeKind::Scatter) {
                return ctx
                    .produced
                    .get(e.from)
                    .map_or(0, |p| p.iter().filter(|f| &f.to == name).count() as u32);
            }
            // A one edge keeps its sender's fanout, which a scatter upstream set at run time
            // (video analytics: split -scatter-> extract -one-> classify).
            ctx.dag
                .incoming(i)
                .find(|e| e.kind == EdgeKind::One)
                .map_or(0, |e| stage_fanout(ctx, e.from))
        }
    }
}

/// The agent instance `k` of function `i` of an unplanned job runs on, by the job machine's rule
/// (`machine::Spread::Rotate`, what `Shape::on_agents` gives every stage): `local` keeps
/// everything on the first agent; otherwise instances go round the agents, shifted by the stage
/// index so that consecutive stages of a chain land on different agents (a `direct` edge then
/// really crosses VMs).
pub fn place(policy: Policy, agents: usize, i: usize, k: u32) -> usize {
    let agents = if policy == Policy::Local { 1 } else { agents };
    sonic_core::machine::Spread::Rotate {
        agents: u32::try_from(agents).unwrap_or(u32::MAX),
        shift: u32::try_from(i).unwrap_or(u32::MAX),
    }
    .place(k, 0) as usize
}

fn source(ctx: &StageContext<'_>, method: Method, f: &Produced) -> Result<FileSource, String> {
    Ok(match method {
        Method::VmStorage => FileSource::VmStorage {
            file_path: f.file_path.clone(),
        },
        Method::Direct => FileSource::Direct {
            peer_url: ctx
                .agents
                .get(f.agent)
                .ok_or_else(|| format!("{} was written on an unknown agent", f.file_path))?
                .url
                .clone(),
            file_path: f.file_path.clone(),
            token: sonic_api::token::issue(
                ctx.file_key,
                ctx.job_id,
                &f.file_path,
                ctx.token_expiry,
            ),
        },
        Method::Remote | Method::Memory => {
            let key = f
                .key
                .clone()
                .ok_or_else(|| format!("{} was not uploaded", f.file_path))?;
            // A `memory` file the tier refused went to the store: read it from there.
            if f.in_memory {
                FileSource::Memory { key }
            } else {
                FileSource::Remote { key }
            }
        }
    })
}

/// The inputs instance `k` of function `i` receives over edge `e`, per the edge kind.
fn edge_inputs(
    ctx: &StageContext<'_>,
    edge: usize,
    k: u32,
    out: &mut Vec<InputSpec>,
) -> Result<(), PlanError> {
    let e = ctx.dag.edges[edge];
    let from = &ctx.dag.functions[e.from].name;
    let to = &ctx.dag.functions[e.to].name;
    let err = |why: String| PlanError::Edge {
        from: from.clone(),
        to: to.clone(),
        why,
    };
    let mut files: Vec<&Produced> = ctx
        .produced
        .get(e.from)
        .map(|p| p.iter().filter(|f| &f.to == to).collect())
        .unwrap_or_default();
    files.sort_by(|a, b| (a.instance, &a.name).cmp(&(b.instance, &b.name)));
    let chosen: Vec<&Produced> = match e.kind {
        EdgeKind::One => files.into_iter().filter(|f| f.instance == k).collect(),
        EdgeKind::Gather | EdgeKind::Broadcast => files,
        EdgeKind::Scatter => {
            // Scatter senders have one instance; part j (in name order) is receiver j's.
            let f = files
                .get(k as usize)
                .copied()
                .ok_or_else(|| err(format!("no part {k} was written")))?;
            vec![f]
        }
        EdgeKind::Shuffle => {
            let part = format!("part-{k}");
            files.into_iter().filter(|f| f.name == part).collect()
        }
    };
    let method = ctx.methods.get(edge).copied().unwrap_or(Method::Remote);
    for f in chosen {
        out.push(InputSpec {
            dest: format!("{from}/{}/{}", f.instance, f.name),
            source: source(ctx, method, f).map_err(&err)?,
            expected_size: Some(f.size),
        });
    }
    Ok(())
}

/// The placements and requests of every instance of function `i` (attempt 1).
pub fn stage_runs(ctx: &StageContext<'_>, i: usize) -> Result<Vec<Placement>, PlanError> {
    let n = stage_fanout(ctx, i);
    if n == 0 {
        return Err(PlanError::Empty(ctx.dag.functions[i].name.clone()));
    }
    instance_runs(ctx, i, n, 0..n)
}

/// Whether an instance of function `i` can start as soon as its own inputs are complete: every
/// edge into it is `one` (instance `k` reads sender instance `k`'s files only) and its fanout is
/// known. `gather`, `broadcast`, `scatter` and `shuffle` receivers wait for all their senders.
pub fn starts_per_instance(dag: &Dag, fanouts: &[Fanout], i: usize) -> bool {
    let mut incoming = dag.incoming(i).peekable();
    incoming.peek().is_some()
        && incoming.all(|e| e.kind == EdgeKind::One)
        && matches!(fanouts.get(i), Some(Fanout::Known(n)) if *n > 0)
}

/// The placements and requests of `instances` of function `i`, which has `n` instances in all
/// (attempt 1). Their senders' files must be in `ctx.produced`.
pub fn instance_runs(
    ctx: &StageContext<'_>,
    i: usize,
    n: u32,
    instances: impl IntoIterator<Item = u32>,
) -> Result<Vec<Placement>, PlanError> {
    if ctx.agents.is_empty() {
        return Err(PlanError::NoAgents);
    }
    let f = &ctx.dag.functions[i];
    let mut fanout_env = BTreeMap::new();
    for e in ctx.dag.outgoing(i) {
        if e.kind == EdgeKind::Shuffle
            && let Some(Fanout::Known(r)) = ctx.fanouts.get(e.to)
        {
            fanout_env.insert(ctx.dag.functions[e.to].name.clone(), *r);
        }
    }
    let mut out = Vec::new();
    for k in instances {
        let mut inputs = Vec::new();
        if ctx.dag.incoming(i).next().is_none() {
            for input in ctx.inputs {
                inputs.push(InputSpec {
                    dest: format!("input/{}", input.name),
                    source: FileSource::Remote {
                        key: input.key.clone(),
                    },
                    expected_size: None,
                });
            }
        }
        for (edge, e) in ctx.dag.edges.iter().enumerate() {
            if e.to == i {
                edge_inputs(ctx, edge, k, &mut inputs)?;
            }
        }
        let mut outputs: Vec<OutputRoute> = Vec::new();
        for (edge, e) in ctx.dag.edges.iter().enumerate() {
            if e.from != i {
                continue;
            }
            let to = &ctx.dag.functions[e.to].name;
            let method = ctx.methods.get(edge).copied().unwrap_or(Method::Remote);
            let uploaded = matches!(method, Method::Remote | Method::Memory);
            outputs.push(OutputRoute {
                to: to.clone(),
                keep_local: !uploaded,
                upload_prefix: uploaded.then(|| format!("jobs/{}/{}/{k}/{to}", ctx.job_id, f.name)),
                memory: method == Method::Memory,
            });
        }
        outputs.push(OutputRoute {
            to: "result".into(),
            keep_local: false,
            upload_prefix: Some(result_prefix(ctx.job_id, ctx.dag, i, k, n)),
            memory: false,
        });
        out.push(Placement {
            agent: place(ctx.policy, ctx.agents.len(), i, k),
            request: RunRequest {
                job_id: ctx.job_id.to_owned(),
                function: f.name.clone(),
                instance: k,
                instances: n,
                attempt: 1,
                execution: 1,
                function_key: Some(function_key(ctx.dag, i)),
                image: f.image.clone(),
                command: f.command.clone(),
                env: f.env.clone(),
                secrets: crate::exec::secrets::env_of(f, ctx.secrets),
                params: ctx.params.clone(),
                fanouts: fanout_env.clone(),
                memory_limit_mb: DEFAULT_MEMORY_MB,
                cpus: 1.0,
                timeout_ms: (f.timeout_s * 1000.0).round().max(1.0) as u64,
                inputs,
                outputs,
                // The agents' configured quota.
                output_quota_mb: None,
                // Set by the executor when it sends the run (it knows where it listens).
                report_url: None,
                handler: ctx.handlers.get(&i).cloned(),
            },
        });
    }
    Ok(out)
}

/// Standard base64 that decodes with or without padding.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// Encodes standard base64, padded.
pub fn encode_base64(data: &[u8]) -> String {
    use base64::Engine as _;
    BASE64.encode(data)
}

/// Decodes standard base64 (with or without padding; whitespace ignored).
pub fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    let compact: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    BASE64.decode(compact).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAG: &str = r#"
name: t
params: { n: 2 }
functions:
  - { name: gen, image: i, command: [synthetic, run, --to, mid], instances: "{{ params.n }}" }
  - { name: mid, image: i, command: [synthetic, copy, --to, sink] }
  - { name: sink, image: i, command: [synthetic, copy, --to, result] }
edges:
  - { from: gen, to: mid, kind: one }
  - { from: mid, to: sink, kind: gather }
"#;

    fn agents() -> Vec<AgentSlot> {
        (1..=2)
            .map(|i| AgentSlot {
                vcpus: None,
                id: format!("a-{i}"),
                url: format!("http://127.0.0.1:{i}"),
                vm_type: "m5.large".into(),
            })
            .collect()
    }

    fn made(to: &str, n: u32, agents: &[usize], keyed: bool) -> Vec<Produced> {
        (0..n)
            .map(|k| Produced {
                instance: k,
                to: to.into(),
                name: "out".into(),
                file_path: format!("f/{k}/{to}/out"),
                agent: agents[k as usize],
                key: keyed.then(|| format!("jobs/j-1/f/{k}/{to}/out")),
                in_memory: false,
                size: 10,
            })
            .collect()
    }

    struct Fixture {
        dag: Dag,
        fanouts: Vec<Fanout>,
        params: serde_json::Map<String, serde_json::Value>,
        agents: Vec<AgentSlot>,
        inputs: Vec<JobInputFile>,
        handlers: BTreeMap<usize, HandlerRun>,
    }

    fn fixture() -> Fixture {
        let dag = Dag::from_yaml("t.yaml", DAG).expect("dag");
        let params = dag.job_params(&BTreeMap::new());
        let fanouts = dag.fanouts(&params).expect("fanouts");
        Fixture {
            dag,
            fanouts,
            params: params.into_iter().collect(),
            agents: agents(),
            inputs: vec![JobInputFile {
                name: "data".into(),
                key: "jobs/j-1/input/data".into(),
            }],
            handlers: BTreeMap::new(),
        }
    }

    fn ctx<'a>(
        f: &'a Fixture,
        policy: Policy,
        methods: &'a [Method],
        produced: &'a [Vec<Produced>],
    ) -> StageContext<'a> {
        StageContext {
            job_id: "j-1",
            dag: &f.dag,
            params: &f.params,
            fanouts: &f.fanouts,
            methods,
            policy,
            agents: &f.agents,
            produced,
            inputs: &f.inputs,
            file_key: b"key",
            token_expiry: 1000,
            handlers: &f.handlers,
            secrets: &NO_SECRETS,
        }
    }

    #[test]
    fn first_stage_gets_the_job_input_and_routes_by_policy() {
        let f = fixture();
        for policy in [Policy::Remote, Policy::Direct, Policy::Local] {
            let methods = edge_methods(&f.dag, policy);
            let runs = stage_runs(&ctx(&f, policy, &methods, &[]), 0).expect("runs");
            assert_eq!(runs.len(), 2);
            for (k, p) in runs.iter().enumerate() {
                let r = &p.request;
                assert_eq!(r.instance, k as u32);
                assert_eq!(r.instances, 2);
                assert_eq!(r.inputs.len(), 1);
                assert_eq!(r.inputs[0].dest, "input/data");
                let mid = &r.outputs[0];
                assert_eq!(mid.to, "mid");
                assert_eq!(mid.keep_local, policy != Policy::Remote);
                assert_eq!(
                    mid.upload_prefix.is_some(),
                    policy == Policy::Remote,
                    "{policy}"
                );
                assert_eq!(r.outputs[1].to, "result");
            }
            let spread: Vec<usize> = runs.iter().map(|p| p.agent).collect();
            if policy == Policy::Local {
                assert_eq!(spread, vec![0, 0]);
            } else {
                assert_eq!(spread, vec![0, 1]);
            }
        }
    }

    #[test]
    fn one_edge_pairs_instances_and_direct_points_at_the_sender() {
        let f = fixture();
        let methods = edge_methods(&f.dag, Policy::Direct);
        let produced = vec![made("mid", 2, &[0, 1], false)];
        let runs = stage_runs(&ctx(&f, Policy::Direct, &methods, &produced), 1).expect("runs");
        assert_eq!(runs.len(), 2);
        for (k, p) in runs.iter().enumerate() {
            assert_eq!(p.request.inputs.len(), 1);
            assert_eq!(p.request.inputs[0].dest, format!("gen/{k}/out"));
            match &p.request.inputs[0].source {
                FileSource::Direct {
                    peer_url,
                    file_path,
                    ..
                } => {
                    assert_eq!(peer_url, &f.agents[k].url);
                    assert_eq!(file_path, &format!("f/{k}/mid/out"));
                }
                other => panic!("expected direct, got {other:?}"),
            }
            // Stage 1 is shifted by one: instance k runs on the other agent than its sender.
            assert_ne!(p.agent, k);
        }
    }

    #[test]
    fn gather_gets_one_folder_per_sender_and_remote_needs_keys() {
        let f = fixture();
        let methods = edge_methods(&f.dag, Policy::Remote);
        let produced = vec![Vec::new(), made("sink", 2, &[1, 0], true)];
        let runs = stage_runs(&ctx(&f, Policy::Remote, &methods, &produced), 2).expect("runs");
        assert_eq!(runs.len(), 1);
        let dests: Vec<&str> = runs[0]
            .request
            .inputs
            .iter()
            .map(|i| i.dest.as_str())
            .collect();
        assert_eq!(dests, vec!["mid/0/out", "mid/1/out"]);
        assert_eq!(
            runs[0].request.outputs,
            vec![OutputRoute {
                to: "result".into(),
                keep_local: false,
                upload_prefix: Some("jobs/j-1/result".into()),
                memory: false,
            }]
        );
        let unkeyed = vec![Vec::new(), made("sink", 2, &[1, 0], false)];
        assert!(matches!(
            stage_runs(&ctx(&f, Policy::Remote, &methods, &unkeyed), 2),
            Err(PlanError::Edge { .. })
        ));
    }

    #[test]
    fn scatter_and_shuffle_pick_their_parts() {
        let dag = Dag::from_yaml(
            "s.yaml",
            r#"
name: s
functions:
  - { name: split, image: i, command: [x] }
  - { name: map, image: i, command: [x] }
  - { name: red, image: i, command: [x], instances: 2 }
edges:
  - { from: split, to: map, kind: scatter }
  - { from: map, to: red, kind: shuffle }
"#,
        )
        .expect("dag");
        let params = dag.job_params(&BTreeMap::new());
        let fanouts = dag.fanouts(&params).expect("fanouts");
        let f = Fixture {
            dag,
            fanouts,
            params: serde_json::Map::new(),
            agents: agents(),
            inputs: Vec::new(),
            handlers: BTreeMap::new(),
        };
        let methods = edge_methods(&f.dag, Policy::Remote);
        let part = |instance: u32, to: &str, name: &str| Produced {
            instance,
            to: to.into(),
            name: name.into(),
            file_path: format!("x/{instance}/{to}/{name}"),
            agent: 0,
            key: Some(format!("k/{instance}/{to}/{name}")),
            in_memory: false,
            size: 1,
        };
        let split = vec![
            part(0, "map", "b"),
            part(0, "map", "a"),
            part(0, "map", "c"),
        ];
        let produced = vec![split.clone()];
        let c = ctx(&f, Policy::Remote, &methods, &produced);
        assert_eq!(stage_fanout(&c, 1), 3);
        let maps = stage_runs(&c, 1).expect("maps");
        let got: Vec<&str> = maps
            .iter()
            .map(|p| p.request.inputs[0].dest.as_str())
            .collect();
        assert_eq!(got, vec!["split/0/a", "split/0/b", "split/0/c"]);
        assert_eq!(maps[0].request.fanouts.get("red"), Some(&2));
        let mapped: Vec<Produced> = (0..3)
            .flat_map(|m| [part(m, "red", "part-0"), part(m, "red", "part-1")])
            .collect();
        let produced = vec![split, mapped];
        let reds = stage_runs(&ctx(&f, Policy::Remote, &methods, &produced), 2).expect("reds");
        assert_eq!(reds.len(), 2);
        for (j, r) in reds.iter().enumerate() {
            let dests: Vec<String> = r.request.inputs.iter().map(|i| i.dest.clone()).collect();
            assert_eq!(
                dests,
                (0..3)
                    .map(|m| format!("map/{m}/part-{j}"))
                    .collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn base64_round_trips_known_vectors() {
        assert_eq!(decode_base64("").expect("empty"), b"");
        assert_eq!(decode_base64("Zg==").expect("f"), b"f");
        assert_eq!(decode_base64("Zm9vYmFy").expect("foobar"), b"foobar");
        assert_eq!(decode_base64("Zm9vYg").expect("unpadded"), b"foob");
        assert!(decode_base64("Zm9v!").is_err());
        assert!(decode_base64("Z").is_err());
        assert!(decode_base64("Zg==Zg").is_err());
    }

    #[test]
    fn policies_parse() {
        for p in [Policy::Remote, Policy::Direct, Policy::Local, Policy::Sonic] {
            assert_eq!(p.as_str().parse::<Policy>(), Ok(p));
        }
        assert!("fast".parse::<Policy>().is_err());
    }

    #[test]
    fn a_handler_stage_names_its_code_not_a_command() {
        let mut f = fixture();
        let run = HandlerRun {
            name: "py".into(),
            sha256: "a".repeat(64),
            key: sonic_api::agent::handler_key(&"a".repeat(64)),
            routes: BTreeMap::from([("sink".to_owned(), "gather".to_owned())]),
        };
        f.handlers.insert(1, run.clone());
        let methods = edge_methods(&f.dag, Policy::Remote);
        let produced = vec![made("mid", 2, &[0, 1], true), vec![], vec![]];
        let ctx = ctx(&f, Policy::Remote, &methods, &produced);
        let mid = stage_runs(&ctx, 1).expect("mid");
        assert!(mid.iter().all(|p| p.request.handler.as_ref() == Some(&run)));
        // The function's own image and command travel unchanged (empty for a handler).
        assert_eq!(mid[0].request.command, f.dag.functions[1].command);
        let first = stage_runs(&ctx, 0).expect("gen");
        assert!(first.iter().all(|p| p.request.handler.is_none()));
        // A new version of the code gets warm environments of its own.
        let mut other = mid[0].request.clone();
        other.handler.as_mut().expect("handler").sha256 = "b".repeat(64);
        assert_ne!(other.warm_key(), mid[0].request.warm_key());
    }

    #[test]
    fn base64_round_trips() {
        for n in 0..10usize {
            let data: Vec<u8> = (0..n as u8).map(|b| b.wrapping_mul(97)).collect();
            let text = encode_base64(&data);
            assert_eq!(text.len() % 4, 0);
            assert_eq!(decode_base64(&text).expect("decode"), data);
        }
        assert_eq!(encode_base64(b"Man"), "TWFu");
        assert_eq!(encode_base64(b"Ma"), "TWE=");
    }
}
