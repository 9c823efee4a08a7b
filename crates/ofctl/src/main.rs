//! `ofctl`: Sonic's command-line tool. Parses arguments and hands them to the library.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = ofctl::Cli::parse();
    // The cluster of `up` and `demo` logs through tracing; quiet unless RUST_LOG asks.
    let default = match cli.command {
        ofctl::Command::Up(_) => "warn",
        _ => "error",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours for a terminal only: a file or a pipe gets the plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default.into()),
        )
        .init();
    match ofctl::run(cli, &mut std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`ofctl get jobs | head`): what it wanted was written.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ofctl: {}", ofctl::one_line(&e));
            ExitCode::from(ofctl::exit_status(&e))
        }
    }
}
