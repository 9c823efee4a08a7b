//! `requirements.txt` environments built in containers of the Python image, so that they are
//! made by the Python they run with (the Docker sandbox's handler stages on agents, and the
//! OpenLambda listener's Docker `/run/` workers).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use futures::StreamExt;

use crate::venv::{BuildFn, Requirements, VenvError};

/// Where a Python handler's `requirements.txt` environment is in its containers: built there
/// and run there (a venv's scripts name its own path).
pub const VENV_DIR: &str = "/sonic/venv";
/// Where pip's cache is while an environment is built.
const PIP_CACHE_DIR: &str = "/sonic/pip-cache";
/// Where the host's CA bundle is while an environment is built.
const CA_FILE: &str = "/sonic/ca-certificates.crt";
/// Marks the containers that build environments.
const LABEL_VENV_BUILD: &str = "sonic.venv-build";

/// Builds `requirements.txt` environments in containers of `image` (the Python image handler
/// stages run in), so that they are made by the Python they run with: one container per build,
/// with the network (pip reaches PyPI), the environment's host folder bound at [`VENV_DIR`] and
/// pip's cache at `/sonic/pip-cache`. `python3 -m venv --without-pip`, then the image's pip
/// (`pip --python`) installs the pins. The container is removed when the build ends or its
/// future is dropped (the time bound).
pub fn venv_builder(image: String) -> Result<BuildFn, String> {
    let docker = Docker::connect_with_local_defaults()
        .map_err(|e| format!("the Docker engine is unreachable: {e}"))?;
    Ok(Arc::new(move |dir, cache, reqs| {
        let (docker, image) = (docker.clone(), image.clone());
        Box::pin(build_venv(docker, image, dir, cache, reqs))
    }))
}

/// Removes a build container when dropped (a build cut short by its time bound).
struct BuildContainer {
    docker: Docker,
    id: Option<String>,
}

impl Drop for BuildContainer {
    fn drop(&mut self) {
        if let Some(id) = self.id.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let docker = self.docker.clone();
            rt.spawn(async move {
                let options = RemoveContainerOptionsBuilder::default().force(true).build();
                let _ = docker.remove_container(&id, Some(options)).await;
            });
        }
    }
}

async fn build_venv(
    docker: Docker,
    image: String,
    dir: PathBuf,
    cache: PathBuf,
    reqs: Requirements,
) -> Result<(), crate::venv::VenvError> {
    let python = format!("python3 of {image}");
    let venv_err = |detail: String| VenvError::Venv {
        python: python.clone(),
        detail,
    };
    tokio::fs::create_dir_all(&dir).await?;
    tokio::fs::create_dir_all(&cache).await?;
    tokio::fs::write(dir.join("requirements.txt"), reqs.text()).await?;
    let docker = docker
        .negotiate_version()
        .await
        .map_err(|e| venv_err(format!("the Docker engine is unreachable: {e}")))?;
    // Exit status 90: the venv could not be made (pip's own statuses are small).
    let script = format!(
        "python3 -m venv --without-pip {VENV_DIR} || exit 90; \
         exec python3 -m pip --python {VENV_DIR}/bin/python install --no-input \
         --disable-pip-version-check -r {VENV_DIR}/requirements.txt"
    );
    let mut env = vec![
        format!("PIP_CACHE_DIR={PIP_CACHE_DIR}"),
        "PYTHONDONTWRITEBYTECODE=1".to_owned(),
        "HOME=/tmp".to_owned(),
    ];
    // What reaches PyPI from here: proxies, the index and its timeout, nothing else of the
    // agent's (its other PIP_* settings may name host paths).
    for (k, v) in std::env::vars() {
        let keep = [
            "PIP_INDEX_URL",
            "PIP_EXTRA_INDEX_URL",
            "PIP_TRUSTED_HOST",
            "PIP_DEFAULT_TIMEOUT",
        ]
        .contains(&k.as_str())
            || ["http_proxy", "https_proxy", "no_proxy"]
                .iter()
                .any(|p| k.eq_ignore_ascii_case(p));
        if keep {
            env.push(format!("{k}={v}"));
        }
    }
    let bind =
        |host: &Path, inside: &str, mode: &str| format!("{}:{inside}:{mode}", host.display());
    let mut binds = vec![
        bind(&dir, VENV_DIR, "rw"),
        bind(&cache, PIP_CACHE_DIR, "rw"),
    ];
    // The host's trust store, so that pip trusts what the agent trusts (a proxy's own CA
    // included): the file pip or Python are told to use, else Debian's bundle.
    let ca = ["PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"]
        .iter()
        .filter_map(|k| std::env::var_os(k).map(PathBuf::from))
        .chain([PathBuf::from("/etc/ssl/certs/ca-certificates.crt")])
        .find(|p| p.is_absolute() && p.is_file() && !p.to_string_lossy().contains([':', ',']));
    if let Some(ca) = ca {
        binds.push(bind(&ca, CA_FILE, "ro"));
        env.push(format!("PIP_CERT={CA_FILE}"));
        env.push(format!("SSL_CERT_FILE={CA_FILE}"));
    }
    let body = ContainerCreateBody {
        image: Some(image.clone()),
        cmd: Some(vec!["sh".into(), "-c".into(), script]),
        env: Some(env),
        labels: Some(HashMap::from([(
            LABEL_VENV_BUILD.to_string(),
            reqs.sha256().to_owned(),
        )])),
        host_config: Some(HostConfig {
            binds: Some(binds),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = docker
        .create_container(
            None::<bollard::query_parameters::CreateContainerOptions>,
            body,
        )
        .await
        .map_err(|e| match e {
            DockerError::DockerResponseServerError {
                status_code: 404, ..
            } => venv_err(format!(
                "image {image} is missing: build it with deploy/build-python-image.sh"
            )),
            e => venv_err(format!("cannot create a container of {image}: {e}")),
        })?;
    let mut guard = BuildContainer {
        docker: docker.clone(),
        id: Some(created.id.clone()),
    };
    let id = created.id;
    docker
        .start_container(&id, None)
        .await
        .map_err(|e| venv_err(format!("cannot start a container of {image}: {e}")))?;
    let code = match docker.wait_container(&id, None).next().await {
        Some(Ok(r)) => r.status_code,
        Some(Err(DockerError::DockerContainerWaitError { code, .. })) => code,
        Some(Err(e)) => return Err(venv_err(format!("waiting for the build: {e}"))),
        None => return Err(venv_err("the build container vanished".into())),
    };
    let mut output = Vec::new();
    let options = bollard::query_parameters::LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .tail("40")
        .build();
    let mut logs = docker.logs(&id, Some(options));
    while let Some(Ok(chunk)) = logs.next().await {
        output.extend_from_slice(&chunk.into_bytes());
    }
    drop(guard.id.take());
    let options = RemoveContainerOptionsBuilder::default().force(true).build();
    let _ = docker.remove_container(&id, Some(options)).await;
    let text = String::from_utf8_lossy(&output);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = |n: usize| lines[lines.len().saturating_sub(n)..].join("\n");
    match code {
        0 => Ok(()),
        90 => Err(venv_err(tail(6))),
        code => Err(VenvError::Pip {
            status: format!("exit status: {code}"),
            tail: tail(8),
        }),
    }
}
