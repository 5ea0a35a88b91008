//! The fault-injecting peer proxy: one listener per node at that node's `--peers`
//! address, forwarding to the node's real `--listen-peer`. Every node dials the same
//! `--peers` list (the cluster id hashes it, so the lists must be equal), and each
//! outbound peer link starts with a HELLO naming its sender, so the proxy learns the
//! directed pair (from → to) of each connection from the HELLO and applies that pair's
//! [`Fault`]. A node only sends on its outbound links (`src/peer/mod.rs`), so one
//! directed pair is one TCP connection in one direction: loss, delay or a cut of it
//! touches that direction alone.
//!
//! Faults act on whole frames (`length u32 | kind u8 | body`, `src/peer/frame.rs`):
//! dropping bytes mid-frame would only close the link, while raft is built to survive a
//! lost message. The HELLO always passes (a cut refuses the link instead).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mortarmq::peer::FRAME_BYTES_MAX;

/// How often a reader with nothing to read looks at its link's fault again (a cut must
/// close an idle link too).
const IDLE_CHECK_MS: u64 = 100;
/// A dialler that sends no HELLO within this is dropped.
const HELLO_WAIT_MS: u64 = 5_000;
/// Connecting to the node behind the proxy.
const DIAL_TIMEOUT_MS: u64 = 1_000;
/// Bytes of a frame before its body: the length and the kind.
const FRAME_HEADER_BYTES: usize = 5;
/// Where the sender's node id sits in a HELLO frame: the header, then `from` at body
/// offset 14 (`src/peer/frame.rs`).
const HELLO_FROM_OFFSET: usize = FRAME_HEADER_BYTES + 14;

/// What happens to the frames of one directed peer link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Pass,
    /// Each frame is dropped with this probability, in percent (100: a silent partition).
    Drop(u32),
    /// Each frame is held this many milliseconds (order kept, as TCP would).
    Delay(u64),
    /// The connection is closed, and new ones are refused after their HELLO.
    Cut,
}

/// The fault of every directed pair, indexed `[from - 1][to - 1]`.
pub struct Links {
    faults: Vec<Vec<Mutex<Fault>>>,
}

impl Links {
    pub fn new(nodes: usize) -> Links {
        let row = || (0..nodes).map(|_| Mutex::new(Fault::Pass)).collect();
        Links {
            faults: (0..nodes).map(|_| row()).collect(),
        }
    }

    pub fn get(&self, from: u8, to: u8) -> Fault {
        let cell = &self.faults[usize::from(from) - 1][usize::from(to) - 1];
        *cell.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set(&self, from: u8, to: u8, fault: Fault) {
        let cell = &self.faults[usize::from(from) - 1][usize::from(to) - 1];
        *cell.lock().unwrap_or_else(|e| e.into_inner()) = fault;
    }

    /// Every link back to [`Fault::Pass`].
    pub fn heal(&self) {
        let n = self.faults.len() as u8;
        for from in 1..=n {
            for to in 1..=n {
                self.set(from, to, Fault::Pass);
            }
        }
    }
}

/// Accepts peer links for node `to` on `listener` and forwards them to `target`.
pub fn spawn(to: u8, listener: TcpListener, target: SocketAddr, links: Arc<Links>, seed: u64) {
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate() {
            let Ok(conn) = conn else { continue };
            let links = Arc::clone(&links);
            let seed = seed ^ (u64::from(to) << 56) ^ n as u64;
            std::thread::spawn(move || serve(conn, to, target, &links, seed));
        }
    });
}

/// Reads whole frames from a stream whose read timeout is [`IDLE_CHECK_MS`].
struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    /// `Ok(None)`: no whole frame yet (timeout); `Err`: end of stream or a bad length.
    fn next(&mut self, s: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(frame) = self.take()? {
                return Ok(Some(frame));
            }
            let mut chunk = [0u8; 64 * 1024];
            match s.read(&mut chunk) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn take(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes(self.buf[..4].try_into().expect("4 bytes")) as usize;
        if len == 0 || len > FRAME_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad frame length",
            ));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        Ok(Some(self.buf.drain(..4 + len).collect()))
    }
}

fn serve(mut client: TcpStream, to: u8, target: SocketAddr, links: &Links, seed: u64) {
    let idle = Duration::from_millis(IDLE_CHECK_MS);
    let _ = client.set_read_timeout(Some(idle));
    let mut frames = Frames { buf: Vec::new() };
    let deadline = Instant::now() + Duration::from_millis(HELLO_WAIT_MS);
    let hello = loop {
        match frames.next(&mut client) {
            Ok(Some(f)) if f.len() > HELLO_FROM_OFFSET => break f,
            Ok(None) if Instant::now() < deadline => continue,
            _ => return,
        }
    };
    let from = hello[HELLO_FROM_OFFSET];
    if from == 0 || usize::from(from) > links.faults.len() || links.get(from, to) == Fault::Cut {
        return;
    }
    let dial = Duration::from_millis(DIAL_TIMEOUT_MS);
    let Ok(mut node) = TcpStream::connect_timeout(&target, dial) else {
        return;
    };
    let _ = node.set_nodelay(true);
    if node.write_all(&hello).is_err() {
        return;
    }
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let clones = (node.try_clone(), node.try_clone(), client.try_clone());
    let (Ok(node_w), Ok(node_r), Ok(client_w)) = clones else {
        return;
    };
    let Ok(client_e) = client.try_clone() else {
        return;
    };
    std::thread::spawn(move || write_out(node_w, client_w, &rx));
    std::thread::spawn(move || watch_eof(node_r, client_e));
    forward(client, node, frames, (from, to), links, seed, tx);
}

/// Reads the dialler's frames and queues each for the writer, or drops it, as the
/// link's fault says; ends both connections on a cut or an end of either.
fn forward(
    mut client: TcpStream,
    node: TcpStream,
    mut frames: Frames,
    (from, to): (u8, u8),
    links: &Links,
    mut rng: u64,
    tx: mpsc::Sender<(Instant, Vec<u8>)>,
) {
    rng |= 1;
    loop {
        let frame = frames.next(&mut client);
        let fault = links.get(from, to);
        let frame = match (frame, fault) {
            (Err(_), _) | (_, Fault::Cut) => break,
            (Ok(None), _) => continue,
            (Ok(Some(f)), _) => f,
        };
        let at = match fault {
            Fault::Drop(pct) => {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                if rng % 100 < u64::from(pct) {
                    continue;
                }
                Instant::now()
            }
            Fault::Delay(ms) => Instant::now() + Duration::from_millis(ms),
            Fault::Pass | Fault::Cut => Instant::now(),
        };
        if tx.send((at, frame)).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = node.shutdown(Shutdown::Both);
}

/// Writes queued frames to the node, each no earlier than its time.
fn write_out(mut node: TcpStream, client: TcpStream, rx: &mpsc::Receiver<(Instant, Vec<u8>)>) {
    while let Ok((at, frame)) = rx.recv() {
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        if node.write_all(&frame).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = node.shutdown(Shutdown::Both);
}

/// The accepting node never writes on this connection; its end (a kill) ends the link,
/// even one whose frames are all dropped.
fn watch_eof(mut node: TcpStream, client: TcpStream) {
    let mut sink = [0u8; 4096];
    while matches!(node.read(&mut sink), Ok(n) if n > 0) {}
    let _ = client.shutdown(Shutdown::Both);
    let _ = node.shutdown(Shutdown::Both);
}
