//! Running `mortarctl` (and `mortard` where a test expects it to refuse) from tests: no
//! MORTAR_ variable of the caller's shell reaches `mortarctl`, and a run that does not
//! end is killed and reported instead of hanging the test.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::mortard::Mortard;

/// The variables `mortarctl` reads (man/mortarctl.1): removed, so that the shell running
/// the tests cannot point them at another broker or give them a token.
pub const ENV_VARS: [&str; 4] = [
    "MORTAR_BROKER",
    "MORTAR_ADMIN",
    "MORTAR_TOKEN",
    "MORTAR_TOKEN_FILE",
];

/// How often a run is looked at while it has not ended.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// `mortarctl` without any of [`ENV_VARS`].
pub fn command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mortarctl"));
    for var in ENV_VARS {
        cmd.env_remove(var);
    }
    cmd
}

/// `mortarctl --broker B [--admin A]`, pointed at `broker`'s listeners.
pub fn against(broker: &Mortard) -> Command {
    let mut cmd = command();
    cmd.args(["--broker", &broker.addr.to_string()]);
    if let Some(admin) = broker.admin {
        cmd.args(["--admin", &admin.to_string()]);
    }
    cmd
}

/// Starts `cmd` with its standard streams piped to the test.
pub fn spawn(mut cmd: Command) -> Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

/// Runs `cmd` with `stdin` as its input to its end; `Err` with what it wrote when it had
/// not ended within `limit` (it is killed then).
pub fn run_to_end(cmd: Command, stdin: &[u8], limit: Duration) -> Result<Output, Output> {
    let mut child = spawn(cmd);
    let mut input = child.stdin.take().expect("piped");
    // A program that exits without reading its input closes the pipe: not a failure.
    let _ = input.write_all(stdin);
    drop(input);
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(child.wait_with_output().unwrap());
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    Ok(child.wait_with_output().unwrap())
}
