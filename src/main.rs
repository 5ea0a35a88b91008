//! `mortard`: the MortarMQ broker daemon. Parses flags, opens the data directory,
//! binds the listeners and runs the reactor until SIGTERM/SIGINT.
//!
//! On start it prints one line per bound listener to stdout (`listening ADDR`,
//! `admin ADDR`), so scripts and tests that pass port 0 learn the real port.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::ExitCode;

use std::sync::Arc;

use mortarmq::admin::Admin;
use mortarmq::broker::{Broker, BrokerConfig, Now};
use mortarmq::config::{self, Command, Config};
use mortarmq::consume::ConsumeConfig;
use mortarmq::log::LogConfig;
use mortarmq::reactor::{Reactor, ReactorConfig};

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

fn load_tokens(config: &Config) -> Result<Option<Vec<Vec<u8>>>, String> {
    let Some(path) = &config.token_file else {
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

fn millis(d: std::time::Duration) -> u64 {
    d.as_millis() as u64
}

fn run(config: Config) -> Result<(), String> {
    for warning in config.warnings() {
        log::warn!("{warning}");
    }
    let tokens = load_tokens(&config)?;
    let broker_config = BrokerConfig {
        data_dir: config.data_dir.clone(),
        durability: config.durability,
        log: LogConfig {
            segment_size_bytes: config.segment_size_bytes,
            retention_size_bytes: config.retention_size_bytes,
            retention_age_ms: config.retention_age.as_millis() as u64,
        },
        max_partitions: config.max_partitions,
        producer_ttl_ms: config.producer_ttl.as_millis() as u64,
        max_data_bytes: config.max_data_size_bytes,
        consume: ConsumeConfig {
            session_timeout_ms: millis(config.session_timeout),
            revoke_timeout_ms: millis(config.revoke_timeout),
            ack_wait_ms: millis(config.ack_wait),
            nack_delay_ms: millis(config.nack_delay),
            max_attempts: config.max_attempts,
            max_credit_count: config.max_credit_count,
            max_credit_bytes: u32::try_from(config.max_credit_size_bytes).unwrap_or(u32::MAX),
            max_subscriptions_per_conn: usize::from(config.max_subscriptions),
            max_groups: config.max_groups as usize,
            max_members_per_group: config.max_members_per_group as usize,
        },
        commit_interval_ms: millis(config.commit_interval),
    };
    let reactor_config = ReactorConfig {
        listen: config.listen,
        max_connections: config.max_connections as usize,
        idle_timeout_ms: config.idle_timeout.as_millis() as u64,
        half_frame_timeout_ms: config.half_frame_timeout.as_millis() as u64,
        max_output_bytes: config.max_output_size_bytes as usize,
        max_pending_requests: config.max_pending_requests as usize,
        max_memory_bytes: config.max_memory_bytes as usize,
        tokens,
    };
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut reactor = Reactor::bind(reactor_config, config.fsync_threads as usize, |submitter| {
        let (broker, report) = Broker::open(
            broker_config,
            Box::new(submitter),
            Now {
                mono_ms: 0,
                wall_ms,
            },
        )?;
        log::info!(
            "data dir {}: leader_epoch {}, {} topics, {} partitions, {} recovery truncations",
            config.data_dir.display(),
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
    let _admin = match config.admin_listen {
        Some(admin_addr) => {
            let (tx, rx) = std::sync::mpsc::channel();
            let last_turn = reactor.attach_admin(rx);
            let waker = reactor.waker();
            let admin = Admin::start(
                admin_addr,
                config.data_dir.clone(),
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
