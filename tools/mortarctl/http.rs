//! The admin HTTP client of `mortarctl`: one request per connection, bounded by
//! `--timeout`, as the admin listener serves (`Connection: close`).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Connects to the first of `addr`'s addresses that answers within `timeout`.
pub(crate) fn dial(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "resolves to no address");
    // `--broker` may list a cluster's nodes, comma-separated: the first that answers.
    for one in addr.split(',').map(str::trim) {
        for a in one.to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
    }
    Err(last)
}

pub(crate) enum HttpError {
    /// Connecting, writing or reading failed (the caller words timeouts).
    Io(io::Error),
    /// The whole message.
    Answer(String),
}

/// A minimal HTTP/1.1 GET with `Connection: close`; the body of a 200 answer. `timeout`
/// bounds the connect, the write and each read.
pub(crate) fn http_get(admin: &str, path: &str, timeout: Duration) -> Result<String, HttpError> {
    let mut s = dial(admin, timeout).map_err(HttpError::Io)?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .map_err(HttpError::Io)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {admin}\r\nAccept: application/json\r\n\
         Connection: close\r\n\r\n"
    )
    .map_err(HttpError::Io)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(HttpError::Io)?;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        let text = format!("admin {admin}{path}: truncated HTTP answer");
        return Err(HttpError::Answer(text));
    };
    let status = head.split(' ').nth(1).unwrap_or("?");
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    if status != "200" {
        let text = format!("admin {admin}{path}: HTTP {status}: {}", body.trim());
        return Err(HttpError::Answer(text));
    }
    Ok(body)
}

pub(crate) fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16);
        match size {
            Ok(n) if n > 0 && rest.len() >= n => {
                out.push_str(&rest[..n]);
                body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
            }
            _ => break,
        }
    }
    out
}

// ---- tables ----
