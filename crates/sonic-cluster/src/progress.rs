//! Progress on stderr: one line redrawn in place on a terminal, nothing when stderr is a file or a
//! pipe (scripts read the result, not the animation).

use std::io::{IsTerminal, Write};

/// A progress line.
#[derive(Debug)]
pub struct Progress {
    tty: bool,
    drawn: usize,
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            drawn: 0,
        }
    }

    /// Redraws the line (terminal only).
    pub fn update(&mut self, line: &str) {
        if !self.tty {
            return;
        }
        let line: String = line.chars().take(120).collect();
        let width = line.chars().count();
        let pad = self.drawn.saturating_sub(width);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{line}{}", " ".repeat(pad));
        let _ = err.flush();
        self.drawn = width;
    }

    /// Erases the line.
    pub fn clear(&mut self) {
        if self.tty && self.drawn > 0 {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{}\r", " ".repeat(self.drawn));
            let _ = err.flush();
            self.drawn = 0;
        }
    }

    /// A line that stays (always printed, terminal or not), below which the progress line resumes.
    pub fn note(&mut self, line: &str) {
        self.clear();
        eprintln!("{line}");
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
