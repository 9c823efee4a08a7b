//! `ofctl`: Sonic's command-line tool. Parses arguments and hands them to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = ofctl::Cli::parse();
    match ofctl::run(cli, &mut std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ofctl: {e:#}");
            ExitCode::from(1)
        }
    }
}
