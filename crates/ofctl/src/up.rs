//! `ofctl up`: a whole cluster in this process ([`sonic_cluster::cluster`] starts it), saved as
//! the context later commands talk to, served until Ctrl-C.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

pub use sonic_cluster::cluster::*;

use crate::config::{self, Saved};
use crate::render::Table;
use crate::{Output, UpArgs};

/// The cluster's choices as a table.
pub fn write_info(
    info: &ClusterInfo,
    memory: &MemoryTierInfo,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    writeln!(out, "sandbox  {}: {}", info.sandbox, info.sandbox_reason)?;
    writeln!(
        out,
        "store    {} {}: {}",
        info.store, info.store_location, info.store_reason
    )?;
    writeln!(out, "memory   {}", memory.describe())?;
    if let Some(l) = &info.lambdas {
        writeln!(out, "lambdas  {}", l.display())?;
    }
    writeln!(out, "data     {}", info.data_dir.display())?;
    if let Some(ol) = &info.openlambda {
        writeln!(
            out,
            "openlambda {ol} (POST /registry/<name>, POST /run/<name>)"
        )?;
    }
    writeln!(out, "agents   {}", info.agents.len())?;
    let mut t = Table::new(&["AGENT", "VM TYPE", "VCPUS", "MEMORY", "NETWORK", "URL"]);
    for a in &info.agents {
        t.row(vec![
            a.agent_id.clone(),
            a.vm_type.clone(),
            a.vcpus.to_string(),
            format!("{} MB", a.memory_mb),
            format!("{:.0} Mbit/s", a.network_mbps),
            a.url.clone(),
        ]);
    }
    t.write("  ", out)
}

impl UpArgs {
    pub fn options(&self, data_dir: PathBuf, listen: SocketAddr) -> ClusterOptions {
        ClusterOptions {
            agents: self.agents,
            catalog: self.catalog.clone(),
            sandbox: self.sandbox,
            store: self.store,
            memory: if self.no_memory_tier {
                MemoryArg::Off
            } else {
                MemoryArg::Auto
            },
            data_dir,
            listen,
            lambdas: self.lambdas.clone(),
            emulate_store: false,
            openlambda: self.openlambda.map(|listen| OpenLambdaOptions {
                listen,
                token: self.openlambda_token.clone().unwrap_or_default(),
                worker_config: self.openlambda_config.clone(),
            }),
        }
    }
}

/// `ofctl up`: start, save the URL and token, report, serve until Ctrl-C, stop.
pub async fn run(args: UpArgs, output: Output, out: &mut dyn Write) -> anyhow::Result<()> {
    let data_dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => config::default_data_dir()?,
    };
    let listen = args
        .listen
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7000)));
    let mut note = |line: &str| eprintln!("{line}");
    let cluster = Cluster::start(args.options(data_dir, listen), &mut note).await?;
    let path = config::path()?;
    let saved = config::save(
        &path,
        &Saved {
            server: cluster.info.server.clone(),
            token: cluster.token.clone(),
            ca_file: None,
        },
    );
    if let Err(e) = saved {
        cluster.stop().await;
        return Err(e);
    }
    let printed = match output {
        Output::Json => {
            let mut v = serde_json::to_value(&cluster.info)?;
            cluster.memory.add_to(&mut v);
            v["config_file"] = serde_json::json!(path);
            v["dashboard"] =
                serde_json::json!(crate::commands::dashboard_url(&cluster.info.server));
            crate::commands::print_json(out, &v)
        }
        Output::Table => (|| {
            write_info(&cluster.info, &cluster.memory, out)?;
            writeln!(
                out,
                "server   {}  (saved with its token in {})",
                cluster.info.server,
                path.display()
            )?;
            writeln!(
                out,
                "dashboard {}  (log in with the \"token\" saved in {})",
                crate::commands::dashboard_url(&cluster.info.server),
                path.display()
            )?;
            writeln!(out, "ready: Ctrl-C stops the cluster")?;
            Ok::<_, std::io::Error>(())
        })()
        .map_err(anyhow::Error::from),
    };
    // A closed stdout (the reader went away) must not take the cluster down with it.
    if let Err(e) = printed.and_then(|()| Ok(out.flush()?)) {
        eprintln!("ofctl: cannot print the cluster's description: {e:#}");
    }
    let waited = wait_for_signal().await;
    eprintln!("stopping the cluster");
    cluster.stop().await;
    waited
}
