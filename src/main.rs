//! `mortard`: the MortarMQ broker daemon. Parses flags, opens the data directory,
//! binds the listeners and runs the reactor until SIGTERM/SIGINT.
//!
//! On start it prints one line per bound listener to stdout (`listening ADDR`,
//! `admin ADDR`), so scripts and tests that pass port 0 learn the real port.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;

use std::sync::Arc;

use mortarmq::admin::{Admin, ADMIN_THREADS_MAX};
use mortarmq::broker::replica::machine::{ReplicaConfig, ReplicaOptions};
use mortarmq::broker::{Broker, BrokerConfig, Now};
use mortarmq::config::{self, ClusterConfig, Command, Config};
use mortarmq::peer::PeersConfig;
use mortarmq::reactor::{Reactor, ReactorConfig, Stopped};
use mortarmq::session::parse_token_file;

/// Exit status for a usage error (bad flag or value).
const EXIT_USAGE: u8 = 2;
/// Exit status for a failure at run time (data dir unusable, cannot bind).
const EXIT_FAILURE: u8 = 1;
/// Descriptors a partition holds: its active segment and its index.
const DESCRIPTORS_PER_PARTITION: u64 = 2;
/// Descriptors besides client connections, partitions and admin connections: stdio,
/// the two listeners, the poll with its waker and signal pipe, files being written
/// atomically (registry, groups, producers), the /healthz probe, and room for the
/// partitions of topics declared after start.
const DESCRIPTORS_MARGIN: u64 = 64;

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
    let filter_override = mortarmq::logging::init(config.log_level, config.log_format);
    if let Some(filter) = filter_override {
        log::info!(
            "log filter {}={filter} (it overrides --log-level {})",
            mortarmq::logging::FILTER_ENV,
            config.log_level.name()
        );
    }
    match run(config) {
        Ok(Stopped::Shutdown) => ExitCode::SUCCESS,
        Ok(Stopped::Restart) => {
            let e = restart();
            log::error!("cannot restart: {e}");
            eprintln!("mortard: cannot restart: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
        Err(e) => {
            log::error!("{e}");
            eprintln!("mortard: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// Executes this binary again with the same arguments and environment, in this process
/// (a supervisor sees no exit): a cluster node goes into or out of an INSTALL this way
/// (`docs/REPLICATION.md` §5.5). Every descriptor but the standard three is close-on-exec.
/// Returns only on failure.
fn restart() -> std::io::Error {
    use std::os::unix::process::CommandExt;
    log::info!("restarting");
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    // Not `current_exe()`: it names the file, which an upgrade may have replaced.
    std::process::Command::new("/proc/self/exe")
        .arg0(argv0)
        .args(args)
        .exec()
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
    let tokens = parse_token_file(&text);
    log::info!("{} tokens loaded from {}", tokens.len(), path.display());
    if tokens.is_empty() {
        log::warn!(
            "--token-file {} holds no token: every CONNECT will be refused",
            path.display()
        );
    }
    Ok(Some(tokens))
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (a soft limit of 1024 is common, a
/// quarter of the default `--max-connections`). Returns the soft limit now in force;
/// `None` when it is unlimited.
fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current?;
    let Some(hard) = limit.maximum.filter(|&hard| hard > soft) else {
        return Some(soft);
    };
    let raised = Rlimit {
        current: Some(hard),
        maximum: Some(hard),
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            log::info!("RLIMIT_NOFILE raised from {soft} to the hard limit {hard}");
            Some(hard)
        }
        Err(e) => {
            log::warn!("cannot raise RLIMIT_NOFILE from {soft} to {hard}: {e}");
            Some(soft)
        }
    }
}

/// Warns when the connections and partitions the broker may hold need more
/// descriptors than it may open: past that, `accept` fails with EMFILE.
fn check_descriptor_limit(limit: Option<u64>, max_connections: usize, partitions: usize) {
    let Some(limit) = limit else {
        return;
    };
    // An admin connection thread holds its socket until it ends, evicted or not.
    let margin = ADMIN_THREADS_MAX as u64 + DESCRIPTORS_MARGIN;
    let partition_fds = DESCRIPTORS_PER_PARTITION * partitions as u64;
    let needed = max_connections as u64 + partition_fds + margin;
    if needed > limit {
        log::warn!(
            "RLIMIT_NOFILE {limit} is below what --max-connections {max_connections} plus \
             {partitions} partitions need ({max_connections} + {partition_fds} + {margin} \
             for admin, listeners and files = {needed}): past it accept fails with EMFILE \
             and clients wait; raise the hard limit (LimitNOFILE= in the service unit) or \
             lower --max-connections"
        );
    }
}

/// Starts the admin HTTP listener, wired to the reactor for snapshots.
fn start_admin(
    reactor: &mut Reactor,
    listener: std::net::TcpListener,
    data_dir: std::path::PathBuf,
    tokens: Option<Vec<Vec<u8>>>,
) -> Result<Admin, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let liveness = reactor.attach_admin(rx);
    let waker = reactor.waker();
    let wake = Arc::new(move || {
        let _ = waker.wake();
    });
    let started = reactor.started();
    let admin = Admin::start(listener, data_dir, tx, wake, liveness, started, tokens)?;
    log::info!(
        "admin HTTP on http://{}/ (/healthz /metrics /stats)",
        admin.addr
    );
    Ok(admin)
}

/// Tells systemd (`Type=notify`, `$NOTIFY_SOCKET`) that the broker serves: the listeners
/// are bound and recovery is done. Without `NOTIFY_SOCKET` this does nothing.
fn notify_ready() {
    if let Err(e) = mortarmq::systemd::notify(mortarmq::systemd::State::Ready) {
        log::warn!("cannot send READY=1 to $NOTIFY_SOCKET: {e}");
    }
}

/// Binds the client listener, then opens the data directory (recovery, a new leader
/// epoch; in a cluster, the raft journal) and the reactor around it. Returns the reactor
/// and the number of partitions.
fn open(
    reactor: ReactorConfig,
    broker: BrokerConfig,
    fsync_threads: usize,
    cluster: Option<(ReplicaConfig, ReplicaOptions)>,
) -> Result<(Reactor, usize), String> {
    let data_dir = broker.data_dir.clone();
    let mut partitions = 0;
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let reactor = Reactor::bind(reactor, fsync_threads, |submitter| {
        let (storage, sink, now) = (
            mortarmq::log::FsStorage::shared(),
            Box::new(submitter),
            Now {
                mono_ms: 0,
                wall_ms,
            },
        );
        let (broker, report) = match cluster {
            Some(replica) => Broker::open_cluster(broker, replica, storage, sink, now)?,
            None => Broker::open(broker, storage, sink, now)?,
        };
        log::info!(
            "data dir {}: leader_epoch {}, {} topics, {} partitions, {} recovery truncations",
            data_dir.display(),
            report.leader_epoch,
            report.topics,
            report.partitions,
            report.truncations
        );
        partitions = report.partitions;
        Ok(broker)
    })?;
    Ok((reactor, partitions))
}

/// The replica's view of `--node-id`/`--peers` and the raft timers. Peers' client
/// addresses (for NOT_LEADER's text) arrive in their HELLOs; a node never names itself.
fn replica_config(config: &Config) -> Option<(ReplicaConfig, ReplicaOptions)> {
    let c = &config.cluster;
    let id = c.node_id.filter(|_| c.is_cluster())?;
    let nodes = c.peers.iter().map(|p| (u64::from(p.id), String::new()));
    let options = ReplicaOptions {
        tick_ms: c.raft_tick_ms,
        ..ReplicaOptions::default()
    };
    let replica = ReplicaConfig {
        id: u64::from(id),
        nodes: nodes.collect(),
        election_ticks: c.election_ticks as usize,
        heartbeat_ticks: c.heartbeat_ticks as usize,
        journal_file_bytes: config.broker.journal_file_bytes,
        journal_retain_bytes: c.journal_retain_bytes,
        applied: 0,
        replication_timeout_ms: c.replication_timeout_ms,
    };
    Some((replica, options))
}

/// Joins the cluster's peer links on the reactor (after the client listener is bound, so
/// the HELLO carries its real address).
fn attach_peers(
    reactor: &mut Reactor,
    cluster: &ClusterConfig,
    listen_peer: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    cluster_uid: Option<u64>,
) -> Result<(), String> {
    let (Some(node_id), Some(listen)) = (cluster.node_id, listen_peer) else {
        return Ok(());
    };
    let client_addr = match cluster.advertise {
        Some(addr) => addr,
        None => reactor.local_addr().ok_or("listener has no address")?,
    };
    let peers = PeersConfig {
        node_id,
        nodes: cluster.peers.iter().map(|p| (p.id, p.addr)).collect(),
        listen,
        client_addr,
        admin_addr,
        cluster_uid,
    };
    reactor.attach_peers(&peers, cluster.raft_tick_ms)?;
    Ok(())
}

fn run(config: Config) -> Result<Stopped, String> {
    for warning in config.warnings() {
        log::warn!("{warning}");
    }
    let replica = replica_config(&config);
    let listen_peer = config.listen_peer_addr();
    let Config {
        mut reactor,
        broker,
        admin_listen,
        token_file,
        fsync_threads,
        // Acted on in `main`, before anything is logged.
        log_level: _,
        log_format: _,
        listen_peer: _,
        cluster,
    } = config;
    reactor.tokens = load_tokens(token_file.as_deref())?;
    // The admin listener's changes take the same tokens (`src/admin/manage.rs`).
    let admin_tokens = reactor.tokens.clone();
    let descriptor_limit = raise_descriptor_limit();
    let max_connections = reactor.max_connections;
    let data_dir = broker.data_dir.clone();
    // First, before anything is written: a second mortard on this directory must leave
    // every file (the epoch too) as it found it.
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| format!("cannot create data directory {}: {e}", data_dir.display()))?;
    mortarmq::broker::check_data_dir_kind(&data_dir, replica.is_some())?;
    let _data_dir_lock = mortarmq::broker::DataDirLock::acquire(&data_dir)?;
    let cluster_uid = match replica {
        Some(_) => mortarmq::broker::settle_cluster_id(
            &*mortarmq::log::FsStorage::shared(),
            &data_dir,
            cluster.cluster_id,
        )?,
        None => None,
    };
    // Bound before the broker opens and bumps the leader epoch (so is the client listener,
    // in `Reactor::bind`): a port in use must not cost an epoch.
    let admin_listener = admin_listen.map(Admin::bind).transpose()?;
    let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
    let (mut reactor, partitions) = open(reactor, broker, fsync_threads, replica)?;
    attach_peers(&mut reactor, &cluster, listen_peer, admin_addr, cluster_uid)?;
    check_descriptor_limit(descriptor_limit, max_connections, partitions);
    let addr = reactor.local_addr().ok_or("listener has no address")?;
    log::info!("mortard {} listening on {addr}", env!("CARGO_PKG_VERSION"));
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "listening {addr}");
    let _admin = match admin_listener {
        Some(listener) => {
            let admin = start_admin(&mut reactor, listener, data_dir, admin_tokens)?;
            let _ = writeln!(stdout, "admin {}", admin.addr);
            Some(admin)
        }
        None => None,
    };
    let _ = stdout.flush();
    drop(stdout);
    notify_ready();
    reactor.run().map_err(|e| format!("reactor failed: {e}"))
}
