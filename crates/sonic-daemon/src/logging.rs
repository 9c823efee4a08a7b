//! The daemons' logs: human-readable text (the default) or one JSON object per line
//! (`--log-format json`, `SONIC_LOG_FORMAT=json`), filtered by `RUST_LOG`.
//!
//! Both formats carry the spans an event happened in: the control plane runs each job in a `job`
//! span (`job`, `dag`, `policy`) and each instance in a `run` span (`function`, `instance`); the
//! agent runs each instance attempt in a `run` span (`run`, `job`, `function`, `instance`,
//! `attempt`). In JSON, `span` is the innermost one and `spans` lists them all, outermost first,
//! each with its fields, so a log pipeline can select every line of one job.

use std::fmt;
use std::str::FromStr;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// How the logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `2026-11-25T04:36:59Z INFO job{job=j-1 dag=fan}: sonic_control::exec: stage starts function=gen`
    #[default]
    Text,
    /// `{"timestamp":...,"level":"INFO","fields":{"message":"stage starts",...},"target":...,"span":{...},"spans":[...]}`
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("{other:?} is not a log format (text, json)")),
        }
    }
}

/// The filter: `RUST_LOG` when set, else `default` (`info`, ...).
pub fn filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}

/// A subscriber writing `format` to `writer`: what [`init`] installs, and what tests install with
/// a buffer. `ansi` colors the text format (for a terminal).
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .with_current_span(true)
                .with_span_list(true)
                .finish(),
        ),
    }
}

/// Installs the process's logger (standard output, colored when it is a terminal); `default` is
/// the filter without `RUST_LOG`.
pub fn init(format: LogFormat, default: &str) -> Result<(), String> {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing::subscriber::set_global_default(subscriber(
        format,
        filter(default),
        std::io::stdout,
        ansi,
    ))
    .map_err(|e| format!("cannot install the logger: {e}"))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Lines written by a subscriber under test.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).write(b)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    fn capture(format: LogFormat) -> String {
        let buf = Buffer::default();
        let sub = subscriber(format, EnvFilter::new("info"), buf.clone(), false);
        tracing::subscriber::with_default(sub, || {
            let job = tracing::info_span!("job", job = "j-1", dag = "fan");
            let _job = job.enter();
            let run = tracing::info_span!("run", function = "mid", instance = 1);
            run.in_scope(|| tracing::info!(bytes = 42, "staged"));
            tracing::debug!("filtered out");
        });
        let bytes = buf.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn json_lines_carry_every_span() {
        let text = capture(LogFormat::Json);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 1, "{text}");
        let l = &lines[0];
        assert_eq!(l["fields"]["message"], "staged");
        assert_eq!(l["fields"]["bytes"], 42);
        assert_eq!(l["span"]["name"], "run");
        assert_eq!(l["span"]["function"], "mid");
        assert_eq!(l["spans"][0]["name"], "job");
        assert_eq!(l["spans"][0]["job"], "j-1");
        assert_eq!(l["spans"][1]["instance"], 1);
    }

    #[test]
    fn text_lines_name_the_spans() {
        let text = capture(LogFormat::Text);
        assert!(
            text.contains("job{job=\"j-1\" dag=\"fan\"}:run{function=\"mid\" instance=1}: "),
            "{text}"
        );
        assert!(!text.contains("filtered out"));
    }

    #[test]
    fn formats_parse() {
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert_eq!("TEXT".parse(), Ok(LogFormat::Text));
        assert!("yaml".parse::<LogFormat>().is_err());
        assert_eq!(LogFormat::default(), LogFormat::Text);
    }
}
