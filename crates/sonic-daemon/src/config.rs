//! Layered configuration: defaults (the type's `#[serde(default)]`), a YAML file, then every flag
//! or environment variable that was set. One loader for every daemon.
//!
//! ```
//! # use serde::Deserialize;
//! #[derive(Deserialize, Default)]
//! #[serde(default, deny_unknown_fields)]
//! struct Tls { cert: Option<String>, key: Option<String> }
//! #[derive(Deserialize, Default)]
//! #[serde(default, deny_unknown_fields)]
//! struct Config { listen: String, tls: Tls }
//!
//! let cfg: Config = sonic_daemon::Layers::new()
//!     .yaml_str("daemon.yaml", "listen: 127.0.0.1:7000\ntls: { cert: a.pem }\n")
//!     .set("tls.key", Some("a.key"))
//!     .extract()
//!     .unwrap();
//! assert_eq!(cfg.listen, "127.0.0.1:7000");
//! assert_eq!(cfg.tls.key.as_deref(), Some("a.key"));
//! ```

use std::path::Path;

use figment::Figment;
use figment::providers::{Data, Format, Serialized};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// A file or a flag that does not parse, or names an unknown setting.
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// YAML through serde-saphyr (bounded, safe; errors with line and column) as a figment format.
struct SaphyrYaml;

impl Format for SaphyrYaml {
    type Error = figment::Error;
    const NAME: &'static str = "YAML";

    fn from_str<T: DeserializeOwned>(string: &str) -> Result<T, figment::Error> {
        serde_saphyr::from_str(string).map_err(|e| {
            figment::Error::from(
                e.to_string()
                    .lines()
                    .next()
                    .unwrap_or("invalid YAML")
                    .to_owned(),
            )
        })
    }
}

/// The layers of one configuration, lowest first.
#[derive(Debug)]
pub struct Layers {
    figment: Figment,
    /// The file, to name it in errors.
    file: Option<String>,
    /// A file that could not be read: reported by [`Layers::extract`].
    unread: Option<ConfigError>,
}

impl Default for Layers {
    fn default() -> Self {
        Layers::new()
    }
}

impl Layers {
    pub fn new() -> Layers {
        Layers {
            figment: Figment::new(),
            file: None,
            unread: None,
        }
    }

    /// Adds a YAML file (it must exist: a missing file named by the user is an error).
    pub fn yaml_file(mut self, path: Option<&Path>) -> Layers {
        let Some(path) = path else { return self };
        let shown = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => {
                self.figment = self.figment.merge(Data::<SaphyrYaml>::string(&text));
                self.file = Some(shown);
            }
            Err(source) => {
                self.unread = Some(ConfigError::Read {
                    path: shown,
                    source,
                })
            }
        }
        self
    }

    /// Adds YAML text, named `name` in errors.
    pub fn yaml_str(mut self, name: &str, text: &str) -> Layers {
        self.figment = self.figment.merge(Data::<SaphyrYaml>::string(text));
        self.file = Some(name.to_owned());
        self
    }

    /// Sets `key` (a dotted path such as `tls.cert`) when `value` is `Some`: a flag or an
    /// environment variable that was given overrides the file.
    pub fn set<V: Serialize>(mut self, key: &str, value: Option<V>) -> Layers {
        if let Some(v) = value {
            self.figment = self.figment.merge(Serialized::default(key, v));
        }
        self
    }

    /// The configuration, or the first error (naming the file, or the flag's setting).
    pub fn extract<T: DeserializeOwned>(self) -> Result<T, ConfigError> {
        if let Some(e) = self.unread {
            return Err(e);
        }
        let file = self.file;
        self.figment.extract().map_err(|e| {
            let key = e.path.join(".");
            let in_file = e
                .metadata
                .as_ref()
                .is_some_and(|m| m.name.starts_with(SaphyrYaml::NAME));
            let kind = e.kind.to_string();
            match (in_file.then_some(file.as_ref()).flatten(), key.is_empty()) {
                // A setting the file got wrong: the file, then the key.
                (Some(f), false) => ConfigError::Parse {
                    path: f.clone(),
                    message: format!("{key}: {kind}"),
                },
                (Some(f), true) => ConfigError::Parse {
                    path: f.clone(),
                    message: kind,
                },
                // A flag or variable (or a setting missing altogether): its key.
                (None, false) => ConfigError::Parse {
                    path: key,
                    message: kind,
                },
                (None, true) => ConfigError::Parse {
                    path: file.unwrap_or_else(|| "configuration".to_owned()),
                    message: kind,
                },
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, Default, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Store {
        endpoint: String,
        bucket: String,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Config {
        listen: String,
        token: String,
        vcpus: u32,
        store: Option<Store>,
    }

    impl Default for Config {
        fn default() -> Self {
            Config {
                listen: "127.0.0.1:7000".into(),
                token: String::new(),
                vcpus: 2,
                store: None,
            }
        }
    }

    #[test]
    fn defaults_then_file_then_flags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.yaml");
        std::fs::write(
            &path,
            "token: from-file\nvcpus: 4\nstore: { endpoint: http://s3, bucket: b }\n",
        )
        .expect("write");
        let cfg: Config = Layers::new()
            .yaml_file(Some(&path))
            .set("token", Some("from-flag"))
            .set("store.bucket", Some("other"))
            .set::<u32>("vcpus", None)
            .extract()
            .expect("extract");
        assert_eq!(cfg.listen, "127.0.0.1:7000", "default kept");
        assert_eq!(cfg.token, "from-flag", "flag over file");
        assert_eq!(cfg.vcpus, 4, "file over default, unset flag ignored");
        assert_eq!(
            cfg.store,
            Some(Store {
                endpoint: "http://s3".into(),
                bucket: "other".into()
            }),
            "a nested flag merges into the file's table"
        );
        let none: Config = Layers::new().extract().expect("defaults");
        assert_eq!(none, Config::default());
    }

    #[test]
    fn errors_name_the_file_or_the_setting() {
        let unknown = Layers::new()
            .yaml_str("c.yaml", "listne: x\n")
            .extract::<Config>();
        assert!(
            matches!(&unknown, Err(ConfigError::Parse { path, message }) if path == "c.yaml" && message.contains("listne")),
            "{unknown:?}"
        );
        let bad_type = Layers::new()
            .yaml_str("c.yaml", "vcpus: many\n")
            .extract::<Config>();
        assert!(
            matches!(&bad_type, Err(ConfigError::Parse { path, message }) if path == "c.yaml" && message.starts_with("vcpus")),
            "{bad_type:?}"
        );
        let bad_flag = Layers::new()
            .yaml_str("c.yaml", "listen: x\n")
            .set("vcpus", Some("many"))
            .extract::<Config>();
        assert!(
            matches!(&bad_flag, Err(ConfigError::Parse { path, .. }) if path == "vcpus"),
            "a flag's error names its setting: {bad_flag:?}"
        );
        let bad_yaml = Layers::new()
            .yaml_str("c.yaml", "listen: [\n")
            .extract::<Config>();
        assert!(
            matches!(bad_yaml, Err(ConfigError::Parse { .. })),
            "{bad_yaml:?}"
        );
        let missing = Layers::new()
            .yaml_file(Some(Path::new("/nonexistent/d.yaml")))
            .extract::<Config>();
        assert!(
            matches!(&missing, Err(ConfigError::Read { path, .. }) if path.contains("nonexistent")),
            "{missing:?}"
        );
    }
}
