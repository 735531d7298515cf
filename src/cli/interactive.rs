//! What a client command does differently on a terminal: it asks before it
//! deletes ([`confirm`]) and shows how far a long operation got
//! ([`progress`], [`spinner`]). Off a terminal (a script, a pipe, CI) it
//! never waits for an answer: a destructive command needs `--yes`, and no
//! progress is drawn.
//!
//! The prompt is a line read from stdin (std's `IsTerminal`): a crate for
//! it (dialoguer) would add raw-mode terminal handling that a y/N question
//! does not need. Progress is indicatif's.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::exit::CliError;

/// Both ends a person would use: stdin to answer, stderr to read the
/// question.
fn interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// Goes on when `yes` (the command's `--yes`), or on a terminal when the
/// user answers y; otherwise the command stops (exit 2 without a terminal,
/// naming `--yes`; exit 1 when the user says no).
pub fn confirm(what: &str, yes: bool) -> Result<(), CliError> {
    if yes {
        return Ok(());
    }
    if !interactive() {
        return Err(CliError::usage(format!(
            "{what}: add --yes to confirm (no terminal to ask on)"
        )));
    }
    eprint!("{what}. Continue? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CliError::error(format!("reading the answer: {e}")))?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(CliError::error("cancelled: nothing was changed")),
    }
}

/// A progress bar of `len` steps on stderr, drawn only on a terminal.
pub fn progress(len: u64, message: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len).with_message(message.to_owned());
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed}, {eta} left)")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// A spinner with a message on stderr (a total not known up front), drawn
/// only on a terminal.
pub fn spinner(message: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner().with_message(message.to_owned());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("a valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}
