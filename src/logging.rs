//! How `mortard` writes its log to standard error: env_logger with a format of our own,
//! as text or as one JSON object per line, and with a syslog priority prefix (`<3>`..`<7>`)
//! when standard error is the systemd journal, so that `journalctl -p err` can filter.
//!
//! The level is `--log-level`, unless `RUST_LOG` is set: env_logger's filter syntax is the
//! finer tool (`RUST_LOG=info,mortarmq::reactor=debug`) and units written before the flag
//! existed set it (docs/DECISIONS.md).

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use crate::config::{LogFormat, LogLevel};

/// The environment variable whose filter, when set, overrides `--log-level`.
pub const FILTER_ENV: &str = "RUST_LOG";
/// Set by systemd to the `DEVICE:INODE` of the stream it connected to standard error
/// (sd-daemon(3), systemd.exec(5)); inherited by children whose stderr may be elsewhere,
/// hence the comparison with standard error itself.
const JOURNAL_STREAM_ENV: &str = "JOURNAL_STREAM";

/// Characters below this (U+0000..U+001F) must be escaped in a JSON string (RFC 8259).
const JSON_CONTROL_END: u32 = 0x20;

/// syslog(3) priorities (an `int` there) that journald reads from a `<N>` line prefix
/// (sd-daemon(3)).
const PRIORITY_ERR: u32 = 3;
const PRIORITY_WARNING: u32 = 4;
const PRIORITY_INFO: u32 = 6;
const PRIORITY_DEBUG: u32 = 7;

/// Installs the logger. Returns the `RUST_LOG` value when it overrode `--log-level`, so
/// that the caller can say so once the logger runs.
pub fn init(level: LogLevel, format: LogFormat) -> Option<String> {
    let journal = stderr_is_journal();
    let mut builder = env_logger::Builder::new();
    builder.target(env_logger::Target::Stderr);
    let filter = std::env::var(FILTER_ENV)
        .ok()
        .filter(|f| !f.trim().is_empty());
    match &filter {
        Some(filter) => builder.parse_filters(filter),
        None => builder.filter_level(level_filter(level)),
    };
    builder.format(move |buf, record| {
        let mut line = String::new();
        if journal {
            let _ = write!(line, "<{}>", syslog_priority(record.level()));
        }
        match format {
            LogFormat::Json => {
                let ts = buf.timestamp_millis().to_string();
                json_line(&mut line, &ts, record);
            }
            // journald stamps each line itself; a second timestamp would only be noise.
            LogFormat::Text if journal => {
                let _ = write!(
                    line,
                    "[{:<5} {}] {}",
                    record.level(),
                    record.target(),
                    record.args()
                );
            }
            LogFormat::Text => {
                let ts = buf.timestamp();
                let (level, target) = (record.level(), record.target());
                let _ = write!(line, "[{ts} {level:<5} {target}] {}", record.args());
            }
        }
        writeln!(buf, "{line}")
    });
    builder.init();
    filter
}

fn level_filter(level: LogLevel) -> log::LevelFilter {
    match level {
        LogLevel::Error => log::LevelFilter::Error,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Debug => log::LevelFilter::Debug,
        LogLevel::Trace => log::LevelFilter::Trace,
    }
}

/// The syslog priority journald should file a line of this level under.
pub fn syslog_priority(level: log::Level) -> u32 {
    match level {
        log::Level::Error => PRIORITY_ERR,
        log::Level::Warn => PRIORITY_WARNING,
        log::Level::Info => PRIORITY_INFO,
        log::Level::Debug | log::Level::Trace => PRIORITY_DEBUG,
    }
}

/// Whether standard error is the journal stream systemd set up: `JOURNAL_STREAM` names
/// its device and inode (sd-daemon(3) says to compare, not merely test for the variable).
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os(JOURNAL_STREAM_ENV) else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(parse_dev_ino) else {
        return false;
    };
    // A duplicate of fd 2 is a File we own, to fstat with std alone.
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    match std::fs::File::from(fd).metadata() {
        Ok(meta) => meta.dev() == dev && meta.ino() == ino,
        Err(_) => false,
    }
}

/// Parses `DEVICE:INODE`, both decimal.
pub fn parse_dev_ino(text: &str) -> Option<(u64, u64)> {
    let (dev, ino) = text.split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

/// One log record as a JSON object: `ts`, `level` (as `--log-level` names it), `target`,
/// `msg`. Written by hand: `mortard` does not link a JSON library.
fn json_line(out: &mut String, ts: &str, record: &log::Record) {
    let level = record.level().as_str().to_ascii_lowercase();
    out.push_str("{\"ts\":");
    json_string(out, ts);
    out.push_str(",\"level\":");
    json_string(out, &level);
    out.push_str(",\"target\":");
    json_string(out, record.target());
    out.push_str(",\"msg\":");
    json_string(out, &record.args().to_string());
    out.push('}');
}

/// `text` as a JSON string; control characters escaped, so the object stays on one line.
/// The one JSON string writer of `mortard`, `/stats` (`admin`) included.
pub fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < JSON_CONTROL_END => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped_onto_one_line() {
        let mut out = String::new();
        json_string(&mut out, "a \"b\" \\ c\nd\te\u{1}é");
        assert_eq!(out, r#""a \"b\" \\ c\nd\te\u0001é""#);
    }

    #[test]
    fn dev_ino_parses_only_two_decimal_numbers() {
        assert_eq!(parse_dev_ino("8:12345"), Some((8, 12345)));
        assert_eq!(parse_dev_ino("8"), None);
        assert_eq!(parse_dev_ino("8:x"), None);
        assert_eq!(parse_dev_ino(""), None);
    }

    #[test]
    fn priorities_follow_syslog() {
        assert_eq!(syslog_priority(log::Level::Error), 3);
        assert_eq!(syslog_priority(log::Level::Warn), 4);
        assert_eq!(syslog_priority(log::Level::Info), 6);
        assert_eq!(syslog_priority(log::Level::Debug), 7);
        assert_eq!(syslog_priority(log::Level::Trace), 7);
    }
}
