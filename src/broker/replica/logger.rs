//! raft 0.7 logs to an `slog::Logger`; this drain forwards each line to the `log` crate,
//! so that raft's lines come out in `mortard`'s formats (`src/logging.rs`), filtered by
//! `--log-level` and `RUST_LOG` like every other line. It replaces raft's
//! `default-logger` feature (slog-term, slog-envlogger, slog-stdlog), which would print
//! in a format and under a filter of its own.

use std::fmt::{self, Write as _};

/// The `log` target of raft's lines: `RUST_LOG=mortarmq::raft=debug` shows them.
pub const RAFT_LOG_TARGET: &str = "mortarmq::raft";

/// The slog drain that forwards to `log`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogDrain;

/// A logger for `raft::Config`/`RawNode::new`: every line goes to `log` under
/// [`RAFT_LOG_TARGET`].
pub fn raft_logger() -> slog::Logger {
    slog::Logger::root(LogDrain, slog::o!())
}

impl slog::Drain for LogDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, values: &slog::OwnedKVList) -> Result<(), Self::Err> {
        let level = log_level(record.level());
        // raft formats many debug lines; skip the work when they would be dropped.
        if log::log_enabled!(target: RAFT_LOG_TARGET, level) {
            let line = render(record, values);
            log::log!(target: RAFT_LOG_TARGET, level, "{line}");
        }
        Ok(())
    }
}

/// slog has one level more than `log` (Critical); it maps onto `error`.
pub fn log_level(level: slog::Level) -> log::Level {
    match level {
        slog::Level::Critical | slog::Level::Error => log::Level::Error,
        slog::Level::Warning => log::Level::Warn,
        slog::Level::Info => log::Level::Info,
        slog::Level::Debug => log::Level::Debug,
        slog::Level::Trace => log::Level::Trace,
    }
}

/// The message, then the record's own key-values, then the logger's (raft puts
/// `raft_id` there), as ` key=value` pairs.
pub fn render(record: &slog::Record<'_>, values: &slog::OwnedKVList) -> String {
    let mut out = KvText(record.msg().to_string());
    // Writing into a String cannot fail, so neither can serializing into it.
    let _ = slog::KV::serialize(&record.kv(), record, &mut out);
    let _ = slog::KV::serialize(values, record, &mut out);
    out.0
}

struct KvText(String);

impl slog::Serializer for KvText {
    fn emit_arguments(&mut self, key: slog::Key, val: &fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Captures what [`render`] makes of each record, as `LogDrain` would log it.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<(log::Level, String)>>>);

    impl slog::Drain for Capture {
        type Ok = ();
        type Err = slog::Never;
        fn log(&self, r: &slog::Record<'_>, v: &slog::OwnedKVList) -> Result<(), slog::Never> {
            let line = (log_level(r.level()), render(r, v));
            self.0.lock().unwrap().push(line);
            Ok(())
        }
    }

    #[test]
    fn lines_keep_their_key_values_and_map_every_level() {
        let capture = Capture::default();
        let root = slog::Logger::root(capture.clone(), slog::o!());
        let node = root.new(slog::o!("raft_id" => 2));
        slog::info!(node, "became leader at term"; "term" => 7);
        slog::error!(node, "plain");
        slog::crit!(root, "critical");
        slog::warn!(root, "w");
        let seen = capture.0.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![
                (
                    log::Level::Info,
                    "became leader at term term=7 raft_id=2".into()
                ),
                (log::Level::Error, "plain raft_id=2".into()),
                (log::Level::Error, "critical".into()),
                (log::Level::Warn, "w".into()),
            ]
        );
        assert_eq!(log_level(slog::Level::Debug), log::Level::Debug);
        assert_eq!(log_level(slog::Level::Trace), log::Level::Trace);
    }

    #[test]
    fn raft_accepts_the_logger() {
        // A RawNode built with it logs its start through the drain without panicking.
        let storage = raft::storage::MemStorage::new_with_conf_state((vec![1], vec![]));
        let config = raft::Config {
            id: 1,
            ..raft::Config::default()
        };
        let node = raft::RawNode::new(&config, storage, &raft_logger()).unwrap();
        assert_eq!(node.raft.id, 1);
    }
}
