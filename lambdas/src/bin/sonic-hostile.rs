//! A lambda that misbehaves on purpose, for the containment tests of the sandboxes
//! (`crates/sonic-agent/tests/it/containment.rs`). It never harms anything by itself beyond what it
//! is asked to try, and says on standard output what each attempt gave.
//!
//! ```text
//! sonic-hostile escape [--tag T]           # write T into /etc, /, ../ and ../../ of its output
//!                                          # folder, /sonic and /sonic/ctl; then a normal result
//! sonic-hostile symlink [--target PATH]    # plant result/leak -> PATH (default /etc/passwd)
//! sonic-hostile fill --file-mb N --max-mb M   # write N MiB files into result/ until M MiB;
//!                                          # "wrote everything" at the end
//! sonic-hostile log --max-mb M             # write M MiB to standard output
//! sonic-hostile sparse --gb N              # a sparse result file N GiB long
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const MIB: usize = 1 << 20;

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn number(args: &[String], name: &str, default: u64) -> u64 {
    flag(args, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn try_write(path: &Path, text: &str) {
    match std::fs::write(path, text) {
        Ok(()) => println!("write {}: ok", path.display()),
        Err(e) => println!("write {}: {e}", path.display()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(out) = std::env::var_os("SONIC_OUTPUT_DIR").map(PathBuf::from) else {
        eprintln!("sonic-hostile: SONIC_OUTPUT_DIR is not set");
        return ExitCode::from(2);
    };
    let result = out.join("result");
    if let Err(e) = std::fs::create_dir_all(&result) {
        eprintln!("sonic-hostile: cannot create {}: {e}", result.display());
        return ExitCode::from(2);
    }
    let mode = args.first().map(String::as_str).unwrap_or("");
    match mode {
        "escape" => {
            let tag = flag(&args, "--tag").unwrap_or_else(|| "sonic-hostile".into());
            for dir in [
                PathBuf::from("/etc"),
                PathBuf::from("/"),
                out.join(".."),
                out.join("../.."),
                PathBuf::from("/sonic"),
                PathBuf::from("/sonic/ctl"),
            ] {
                try_write(&dir.join(&tag), "escaped\n");
            }
            try_write(&result.join("ok"), "a normal output\n");
        }
        "symlink" => {
            let target = flag(&args, "--target").unwrap_or_else(|| "/etc/passwd".into());
            match std::os::unix::fs::symlink(&target, result.join("leak")) {
                Ok(()) => println!("symlink result/leak -> {target}: ok"),
                Err(e) => println!("symlink result/leak -> {target}: {e}"),
            }
        }
        "fill" => {
            let file_mb = number(&args, "--file-mb", 1).max(1) as usize;
            let max_mb = number(&args, "--max-mb", 64) as usize;
            let chunk = vec![0x5au8; MIB];
            let mut written = 0usize;
            let mut n = 0;
            while written < max_mb {
                let path = result.join(format!("fill-{n}"));
                let mut f = match std::fs::File::create(&path) {
                    Ok(f) => f,
                    Err(e) => {
                        println!("create {}: {e}", path.display());
                        return ExitCode::from(1);
                    }
                };
                for _ in 0..file_mb.min(max_mb - written) {
                    if let Err(e) = f.write_all(&chunk) {
                        println!("write {} after {written} MiB: {e}", path.display());
                        return ExitCode::from(1);
                    }
                    written += 1;
                }
                n += 1;
            }
            println!("wrote everything: {written} MiB in {n} files");
        }
        "log" => {
            let max_mb = number(&args, "--max-mb", 64) as usize;
            let line = [b'x'; 1023];
            let mut stdout = std::io::stdout().lock();
            for _ in 0..max_mb * 1024 {
                if stdout
                    .write_all(&line)
                    .and_then(|()| stdout.write_all(b"\n"))
                    .is_err()
                {
                    return ExitCode::from(1);
                }
            }
            let _ = writeln!(stdout, "wrote everything: {max_mb} MiB of log");
        }
        "sparse" => {
            let gb = number(&args, "--gb", 1);
            let path = result.join("sparse");
            let made = std::fs::File::create(&path).and_then(|f| f.set_len(gb << 30));
            match made {
                Ok(()) => println!("sparse {} of {gb} GiB: ok", path.display()),
                Err(e) => println!("sparse {}: {e}", path.display()),
            }
        }
        _ => {
            eprintln!("usage: sonic-hostile escape|symlink|fill|log|sparse [options]");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
