//! `mortard`: the MortarMQ broker daemon. Parses flags, opens the data directory,
//! binds the listeners and runs the reactor until SIGTERM/SIGINT.
//!
//! On start it prints one line per bound listener to stdout (`listening ADDR`,
//! `admin ADDR`), so scripts and tests that pass port 0 learn the real port.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;

use std::sync::Arc;

use mortarmq::admin::Admin;
use mortarmq::broker::{Broker, Now};
use mortarmq::config::{self, Command, Config};
use mortarmq::reactor::Reactor;

/// Exit status for a usage error (bad flag or value).
const EXIT_USAGE: u8 = 2;
/// Exit status for a failure at run time (data dir unusable, cannot bind).
const EXIT_FAILURE: u8 = 1;

fn main() -> ExitCode {
    let config = match config::parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(config)) => config,
        Ok(Command::Help(text)) | Ok(Command::Version(text)) => {
            println!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e}");
            eprintln!("mortard: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn load_tokens(path: Option<&Path>) -> Result<Option<Vec<Vec<u8>>>, String> {
    let Some(path) = path else {
        return Ok(None);
    };
    let meta =
        std::fs::metadata(path).map_err(|e| format!("--token-file {}: {e}", path.display()))?;
    if meta.permissions().mode() & 0o044 != 0 {
        log::warn!(
            "--token-file {} is readable by group or others; chmod 600 it",
            path.display()
        );
    }
    let text = std::fs::read(path).map_err(|e| format!("--token-file {}: {e}", path.display()))?;
    let tokens: Vec<Vec<u8>> = text
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line).to_vec())
        .filter(|line| !line.is_empty())
        .collect();
    log::info!("{} tokens loaded from {}", tokens.len(), path.display());
    Ok(Some(tokens))
}

fn run(config: Config) -> Result<(), String> {
    for warning in config.warnings() {
        log::warn!("{warning}");
    }
    let Config {
        mut reactor,
        broker,
        admin_listen,
        token_file,
        fsync_threads,
        // Reserved for replication: checked and warned about, nothing binds it yet.
        listen_peer: _,
    } = config;
    reactor.tokens = load_tokens(token_file.as_deref())?;
    let data_dir = broker.data_dir.clone();
    // First, before anything is written: a second mortard on this directory must leave
    // every file (the epoch too) as it found it.
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| format!("cannot create data directory {}: {e}", data_dir.display()))?;
    let _data_dir_lock = mortarmq::broker::DataDirLock::acquire(&data_dir)?;
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut reactor = Reactor::bind(reactor, fsync_threads, |submitter| {
        let (broker, report) = Broker::open(
            broker,
            mortarmq::log::FsStorage::shared(),
            Box::new(submitter),
            Now {
                mono_ms: 0,
                wall_ms,
            },
        )?;
        log::info!(
            "data dir {}: leader_epoch {}, {} topics, {} partitions, {} recovery truncations",
            data_dir.display(),
            report.leader_epoch,
            report.topics,
            report.partitions,
            report.truncations
        );
        Ok(broker)
    })?;
    let addr = reactor.local_addr().ok_or("listener has no address")?;
    log::info!("mortard {} listening on {addr}", env!("CARGO_PKG_VERSION"));
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "listening {addr}");
    let _admin = match admin_listen {
        Some(admin_addr) => {
            let (tx, rx) = std::sync::mpsc::channel();
            let last_turn = reactor.attach_admin(rx);
            let waker = reactor.waker();
            let admin = Admin::start(
                admin_addr,
                data_dir,
                tx,
                Arc::new(move || {
                    let _ = waker.wake();
                }),
                last_turn,
                reactor.started(),
            )?;
            log::info!(
                "admin HTTP on http://{}/ (/healthz /metrics /stats)",
                admin.addr
            );
            let _ = writeln!(stdout, "admin {}", admin.addr);
            Some(admin)
        }
        None => None,
    };
    let _ = stdout.flush();
    drop(stdout);
    reactor.run().map_err(|e| format!("reactor failed: {e}"))
}
