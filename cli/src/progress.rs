//! Progress bars on stderr for long work (import, export, verify, compact): drawn only when stderr
//! is a terminal, with rate and time left; hidden (nothing written at all) otherwise.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressState, ProgressStyle};

/// Whether progress may be drawn: stderr is a terminal.
fn enabled() -> bool {
    std::io::stderr().is_terminal()
}

/// A bar with `template`, or a hidden one when stderr is not a terminal.
fn styled(len: Option<u64>, template: &str) -> ProgressBar {
    if !enabled() {
        return ProgressBar::hidden();
    }
    let bar = match len {
        Some(len) => ProgressBar::new(len),
        None => ProgressBar::new_spinner(),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        // Whole items per second (`{per_sec}` prints four decimals).
        let style = style
            .with_key("rate", |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.0}/s", state.per_sec());
            })
            .progress_chars("=> ");
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Bytes of an input read against its size.
pub(crate) fn bytes(total: u64) -> ProgressBar {
    styled(
        Some(total),
        "{spinner} {elapsed_precise} [{bar:24}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
    )
}

/// Items done against an expected count.
pub(crate) fn items(total: u64, what: &str) -> ProgressBar {
    styled(
        Some(total),
        &format!(
            "{{spinner}} {{elapsed_precise}} [{{bar:24}}] {{human_pos}}/{{human_len}} {what} {{rate}}, {{eta}} left"
        ),
    )
}

/// A count of items with a rate, for work of unknown size (stdin).
pub(crate) fn counter(what: &str) -> ProgressBar {
    styled(
        None,
        &format!("{{spinner}} {{elapsed_precise}} {{human_pos}} {what} {{rate}}"),
    )
}

/// A spinner with a message and the time elapsed, for work without steps to count.
pub(crate) fn spinner(message: &str) -> ProgressBar {
    let bar = styled(None, "{spinner} {elapsed_precise} {msg}");
    bar.set_message(message.to_owned());
    bar
}
