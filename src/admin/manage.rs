//! The admin routes that describe topics and change groups and topics (issue 17; the
//! choices are in docs/DECISIONS.md, "Admin writes"):
//!
//! ```text
//! GET    /topics/{name}                 partitions, retention, groups with lag
//! POST   /topics/{name}/purge           drop every record; sequences go on
//! DELETE /groups/{group}?topic=T        remove a group without members
//! POST   /groups/{group}/reset?topic=T&to=earliest|latest|sequence:N|time:T[&partition=P]
//! ```
//!
//! A change needs the broker's token as `Authorization: Bearer TOKEN` (any line of
//! `--token-file`, compared in constant time); without a token file only loopback peers
//! may change anything. Every error is JSON: `{"error": NAME, "code": "0x…" (when the
//! registry has one), "message": …}`. A change is answered once durable; the reactor
//! gets [`ADMIN_CHANGE_TIMEOUT_MS`] for that, then the answer is 504.

use std::net::IpAddr;

use crate::broker::manage::{
    Change, ChangeDone, ManageError, ManageErrorKind, ResetTo, TopicDescription,
};
use crate::wire::ErrorCode;

use super::http::Request;
use super::Json;

/// How long a change may take to become durable (a positions write, or a purge's
/// fsyncs) before the admin thread answers 504. Below `mortarctl`'s default `--timeout`
/// (10 s), so the operator reads the broker's answer rather than a client timeout.
pub const ADMIN_CHANGE_TIMEOUT_MS: u64 = 8_000;

/// A description or a change, for the reactor.
#[derive(Debug)]
pub enum ManageAsk {
    Describe { topic: String },
    Change(Change),
}

#[derive(Debug)]
pub enum ManageAnswer {
    Described(Result<TopicDescription, ManageError>),
    Changed(Result<ChangeDone, ManageError>),
}

/// An answer: status, content type, body, extra headers.
pub(super) type Reply = (u16, &'static str, String, Vec<(&'static str, String)>);

/// What a route needs from the listener: who asks, and a way to ask the reactor.
pub(super) struct Asker<'a> {
    pub peer: Option<IpAddr>,
    pub tokens: Option<&'a [Vec<u8>]>,
    /// `None`: the reactor did not answer in time (the `bool` says whether it looked
    /// stalled before the ask, 503, or just slow, 504).
    pub ask: &'a dyn Fn(ManageAsk) -> Result<ManageAnswer, bool>,
}

/// Answers `request` if it is one of this file's routes; `None` leaves it to others.
pub(super) fn route(request: &Request, asker: &Asker) -> Option<Reply> {
    let path = request.path.strip_prefix('/')?;
    let parts: Vec<&str> = path.split('/').collect();
    let (allow, ask) = match parts.as_slice() {
        ["topics", name] => ("GET", Route::Describe(decode(name))),
        ["topics", name, "purge"] => ("POST", Route::Purge(decode(name))),
        ["groups", group] => ("DELETE", Route::Delete(decode(group))),
        ["groups", group, "reset"] => ("POST", Route::Reset(decode(group))),
        _ => return None,
    };
    if request.method.as_str() != allow {
        let why = format!("{} takes {allow} only", request.path);
        let mut reply = error(405, "METHOD_NOT_ALLOWED", None, &why);
        reply.3.push(("Allow", allow.to_string()));
        return Some(reply);
    }
    if !matches!(ask, Route::Describe(_)) {
        if let Err(reply) = authorize(request, asker) {
            return Some(reply);
        }
    }
    let query = Query::parse(&request.query);
    Some(match ask.into_ask(&query) {
        Ok(ask) => answer(asker, ask),
        Err(reply) => reply,
    })
}

enum Route {
    Describe(String),
    Purge(String),
    Delete(String),
    Reset(String),
}

impl Route {
    fn into_ask(self, q: &Query) -> Result<ManageAsk, Reply> {
        Ok(match self {
            Route::Describe(topic) => ManageAsk::Describe {
                topic: topic_name(topic)?,
            },
            Route::Purge(topic) => ManageAsk::Change(Change::Purge {
                topic: topic_name(topic)?,
            }),
            Route::Delete(group) => ManageAsk::Change(Change::DeleteGroup {
                group: group_name(group)?,
                topic: topic_name(q.required("topic")?)?,
            }),
            Route::Reset(group) => ManageAsk::Change(Change::ResetGroup {
                group: group_name(group)?,
                topic: topic_name(q.required("topic")?)?,
                to: parse_reset_to(&q.required("to")?).map_err(|why| invalid(&why))?,
                partition: q.partition()?,
            }),
        })
    }
}

fn invalid(why: &str) -> Reply {
    let code = ErrorCode::InvalidArgument;
    error(400, code.name(), Some(code), why)
}

fn topic_name(name: String) -> Result<String, Reply> {
    let source = name.strip_suffix(crate::wire::DLQ_SUFFIX).unwrap_or(&name);
    if crate::broker::topics::valid_name(source.as_bytes()) {
        return Ok(name);
    }
    let code = ErrorCode::InvalidTopicName;
    let why = format!("'{name}' is not a topic name (1-255 of A-Z a-z 0-9 . _ -)");
    Err(error(400, code.name(), Some(code), &why))
}

fn group_name(name: String) -> Result<String, Reply> {
    if crate::broker::topics::valid_name(name.as_bytes()) {
        return Ok(name);
    }
    let code = ErrorCode::InvalidGroupName;
    let why = format!("'{name}' is not a group name (1-255 of A-Z a-z 0-9 . _ -)");
    Err(error(400, code.name(), Some(code), &why))
}

/// 401 without the broker's token (or with a wrong one), 403 for a change from
/// another host when the broker has no token file.
fn authorize(request: &Request, asker: &Asker) -> Result<(), Reply> {
    let Some(tokens) = asker.tokens else {
        if asker.peer.is_some_and(|ip| ip.is_loopback()) {
            return Ok(());
        }
        let why = "this broker has no --token-file: changes are accepted from loopback only";
        return Err(error(403, "FORBIDDEN", None, why));
    };
    let offered = request.header("Authorization").and_then(|v| {
        let (scheme, token) = v.split_once(' ')?;
        scheme.eq_ignore_ascii_case("Bearer").then(|| token.trim())
    });
    let code = ErrorCode::AuthFailed;
    let (why, challenge) = match offered {
        Some(t) if crate::session::token_matches(tokens, t.as_bytes()) => return Ok(()),
        Some(_) => (
            "the token is not one of the broker's (--token-file)",
            "Bearer realm=\"mortard\", error=\"invalid_token\"",
        ),
        None => (
            "changes need the broker's token: Authorization: Bearer TOKEN \
             (mortarctl --token, --token-file or $MORTAR_TOKEN)",
            "Bearer realm=\"mortard\"",
        ),
    };
    let mut reply = error(401, code.name(), Some(code), why);
    reply.3.push(("WWW-Authenticate", challenge.to_string()));
    Err(reply)
}

fn answer(asker: &Asker, ask: ManageAsk) -> Reply {
    let answer = match (asker.ask)(ask) {
        Ok(answer) => answer,
        Err(true) => {
            let why = "the broker's event loop is stalled; nothing was changed";
            return error(503, "UNAVAILABLE", None, why);
        }
        Err(false) => {
            let why = format!(
                "the change was not durable within {ADMIN_CHANGE_TIMEOUT_MS} ms; it may \
                 still complete: look before trying again"
            );
            return error(504, "TIMEOUT", None, &why);
        }
    };
    let json = match answer {
        ManageAnswer::Described(Ok(d)) => describe_json(&d),
        ManageAnswer::Changed(Ok(done)) => done_json(&done),
        ManageAnswer::Described(Err(e)) | ManageAnswer::Changed(Err(e)) => return manage_error(&e),
    };
    (200, "application/json", json.render(true), Vec::new())
}

fn manage_error(e: &ManageError) -> Reply {
    use ManageErrorKind as K;
    let (status, name, code) = match e.kind {
        K::UnknownTopic => (404, "", Some(ErrorCode::UnknownTopic)),
        K::UnknownPartition => (404, "", Some(ErrorCode::UnknownPartition)),
        K::UnknownGroup => (404, "UNKNOWN_GROUP", None),
        K::GroupHasMembers => (409, "GROUP_HAS_MEMBERS", None),
        K::GroupBusy => (409, "GROUP_BUSY", None),
        // 421 Misdirected Request: the leader, which the message names, takes it.
        K::Cluster(ErrorCode::NotLeader) => (421, "", Some(ErrorCode::NotLeader)),
        // The entry may still commit and apply: as the admin thread's own 504.
        K::Cluster(ErrorCode::ReplicationTimeout) => (504, "", Some(ErrorCode::ReplicationTimeout)),
        K::Cluster(code) => (503, "", Some(code)),
        K::Storage => (500, "", Some(ErrorCode::InternalError)),
    };
    let name = code.map_or(name, ErrorCode::name);
    error(status, name, code, &e.message)
}

/// A JSON error answer.
pub(super) fn error(status: u16, name: &str, code: Option<ErrorCode>, why: &str) -> Reply {
    let mut fields = vec![("error", Json::Str(name.to_string()))];
    if let Some(code) = code {
        fields.push(("code", Json::Str(format!("0x{:04X}", code.code()))));
    }
    fields.push(("message", Json::Str(why.to_string())));
    let body = Json::Obj(fields).render(false) + "\n";
    (status, "application/json", body, Vec::new())
}

fn describe_json(d: &TopicDescription) -> Json {
    let partitions = d.partitions.iter().map(|p| {
        let records = (p.last_sequence + 1).saturating_sub(p.first_sequence);
        Json::Obj(vec![
            ("partition", Json::Num(p.partition.into())),
            ("first_sequence", Json::Num(p.first_sequence)),
            ("last_sequence", Json::Num(p.last_sequence)),
            ("records", Json::Num(records)),
            ("bytes", Json::Num(p.bytes)),
            ("segments", Json::Num(p.segments.into())),
            ("poisoned", Json::Bool(p.poisoned)),
        ])
    });
    let groups = d.groups.iter().map(|g| {
        let parts = g.partitions.iter().map(|&(p, committed, lag)| {
            Json::Obj(vec![
                ("partition", Json::Num(p.into())),
                ("committed", Json::Num(committed)),
                ("lag", Json::Num(lag)),
            ])
        });
        Json::Obj(vec![
            ("name", Json::Str(g.name.clone())),
            ("members", Json::Num(g.members as u64)),
            ("lag", Json::Num(g.partitions.iter().map(|p| p.2).sum())),
            ("partitions", Json::Arr(parts.collect())),
        ])
    });
    Json::Obj(vec![
        ("name", Json::Str(d.name.clone())),
        ("topic_id", Json::Num(d.topic_id.into())),
        ("dlq_twin", Json::Bool(d.dlq_twin)),
        ("paired_with", Json::Str(d.paired_with.clone())),
        ("segment_size_bytes", Json::Num(d.segment_size_bytes)),
        ("retention_size_bytes", Json::Num(d.retention_size_bytes)),
        ("retention_age_ms", Json::Num(d.retention_age_ms)),
        ("partitions", Json::Arr(partitions.collect())),
        ("groups", Json::Arr(groups.collect())),
    ])
}

fn done_json(done: &ChangeDone) -> Json {
    match done {
        ChangeDone::GroupDeleted => Json::Obj(vec![("deleted", Json::Bool(true))]),
        ChangeDone::GroupReset(targets) => {
            let parts = targets.iter().map(|&(p, next)| {
                Json::Obj(vec![
                    ("partition", Json::Num(p.into())),
                    ("next_sequence", Json::Num(next)),
                    ("committed", Json::Num(next.saturating_sub(1))),
                ])
            });
            Json::Obj(vec![("partitions", Json::Arr(parts.collect()))])
        }
        ChangeDone::Purged(parts) => {
            let parts = parts.iter().map(|&(p, first, records)| {
                Json::Obj(vec![
                    ("partition", Json::Num(p.into())),
                    ("first_sequence", Json::Num(first)),
                    ("records_purged", Json::Num(records)),
                ])
            });
            Json::Obj(vec![("partitions", Json::Arr(parts.collect()))])
        }
    }
}

/// A query string's `name=value` pairs, percent-decoded (`+` stays a plus: it is the
/// sign of a time zone offset far more often than a space here).
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(query: &str) -> Query {
        let pairs = query.split('&').filter(|p| !p.is_empty());
        let split = |p: &str| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        };
        Query(pairs.map(split).collect())
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn required(&self, name: &str) -> Result<String, Reply> {
        match self.get(name) {
            Some(v) if !v.is_empty() => Ok(v.to_string()),
            _ => Err(invalid(&format!("the query needs {name}="))),
        }
    }

    fn partition(&self) -> Result<Option<u16>, Reply> {
        let Some(text) = self.get("partition") else {
            return Ok(None);
        };
        let why = format!("partition={text}: not a partition number");
        text.parse().map(Some).map_err(|_| invalid(&why))
    }
}

/// Percent-decoding; a malformed escape is kept as it is.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `earliest`, `latest`, `sequence:N`, `time:MS` (ms since the epoch) or
/// `time:RFC3339` (`2024-05-01T12:00:00Z`, `…+02:00`, fractions of a second allowed).
pub fn parse_reset_to(text: &str) -> Result<ResetTo, String> {
    let bad = || {
        format!(
            "to={text}: expected earliest, latest, sequence:N, time:MS (ms since the epoch) \
             or time:RFC3339 (2024-05-01T12:00:00Z)"
        )
    };
    match text.split_once(':') {
        None if text == "earliest" => Ok(ResetTo::Earliest),
        None if text == "latest" => Ok(ResetTo::Latest),
        Some(("sequence", n)) => n.parse().map(ResetTo::Sequence).map_err(|_| bad()),
        Some(("time", t)) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => {
            t.parse().map(ResetTo::TimeMs).map_err(|_| bad())
        }
        Some(("time", t)) => rfc3339_ms(t).map(ResetTo::TimeMs).ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// Milliseconds since the epoch of an RFC 3339 date-time (`T` or a space between date
/// and time; `Z` or `±HH:MM`); `None` if it is not one or is before 1970.
pub fn rfc3339_ms(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let s = text.get(from..from + len)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let seps = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if b.len() < 20 || seps.iter().any(|&(i, c)| b[i] != c) || !matches!(b[10], b'T' | b't' | b' ')
    {
        return None;
    }
    let (y, mo, d) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (h, mi, s) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut at = 19;
    let mut millis = 0i64;
    if b.get(at) == Some(&b'.') {
        let digits = b[at + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        let frac = &text[at + 1..at + 1 + digits.min(3)];
        millis = format!("{frac:0<3}").parse().ok()?;
        at += 1 + digits;
    }
    let offset_min = match &text[at..] {
        "Z" | "z" => 0,
        zone if zone.len() == 6 && matches!(zone.as_bytes()[0], b'+' | b'-') => {
            let (oh, om) = (num(at + 1, 2)?, num(at + 4, 2)?);
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            (zone.as_bytes()[3] == b':').then_some(sign * (oh * 60 + om))?
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3_600 + mi * 60 + s - offset_min * 60;
    u64::try_from(secs * 1_000 + millis).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_targets_parse() {
        assert_eq!(parse_reset_to("earliest"), Ok(ResetTo::Earliest));
        assert_eq!(parse_reset_to("latest"), Ok(ResetTo::Latest));
        assert_eq!(parse_reset_to("sequence:42"), Ok(ResetTo::Sequence(42)));
        assert_eq!(parse_reset_to("time:1000"), Ok(ResetTo::TimeMs(1000)));
        let t = parse_reset_to("time:2024-05-01T12:00:00Z");
        assert_eq!(t, Ok(ResetTo::TimeMs(1_714_564_800_000)));
        for bad in [
            "",
            "first",
            "sequence:",
            "sequence:-1",
            "time:",
            "time:yesterday",
        ] {
            assert!(parse_reset_to(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rfc3339_times_are_read_with_zones_and_fractions() {
        assert_eq!(rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_ms("2000-03-01T00:00:00Z"), Some(951_868_800_000));
        assert_eq!(
            rfc3339_ms("2024-05-01T14:00:00+02:00"),
            Some(1_714_564_800_000)
        );
        assert_eq!(
            rfc3339_ms("2024-05-01T11:30:00-00:30"),
            Some(1_714_564_800_000)
        );
        assert_eq!(
            rfc3339_ms("2024-05-01 12:00:00.25Z"),
            Some(1_714_564_800_250)
        );
        assert_eq!(
            rfc3339_ms("2024-05-01T12:00:00.123456Z"),
            Some(1_714_564_800_123)
        );
        for bad in [
            "2024-05-01",
            "2024-13-01T00:00:00Z",
            "2024-05-01T12:00:00",
            "2024-05-01T12:00:00+0200",
            "1969-12-31T23:59:59Z",
            "2024-05-01T12:00:00.Z",
        ] {
            assert_eq!(rfc3339_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn without_a_token_file_changes_come_from_loopback_only() {
        let head = |auth: &str| format!("POST /topics/t/purge HTTP/1.1\r\nHost: x\r\n{auth}");
        let plain = super::super::http::parse_request(head("").as_bytes()).unwrap();
        let bearer = head("Authorization: bearer t");
        let bearer = super::super::http::parse_request(bearer.as_bytes()).unwrap();
        // The reactor "times out": 504 shows the request got past the checks.
        let reactor = |_: ManageAsk| -> Result<ManageAnswer, bool> { Err(false) };
        let tokens = vec![b"t".to_vec()];
        let status = |request: &Request, peer: &str, tokens: Option<&[Vec<u8>]>| {
            let peer = Some(peer.parse().unwrap());
            let asker = Asker {
                peer,
                tokens,
                ask: &reactor,
            };
            route(request, &asker).unwrap().0
        };
        assert_eq!(status(&plain, "10.0.0.7", None), 403);
        assert_eq!(status(&plain, "127.0.0.1", None), 504);
        assert_eq!(status(&plain, "::1", None), 504);
        assert_eq!(
            status(&plain, "127.0.0.1", Some(&tokens)),
            401,
            "a token file: always"
        );
        assert_eq!(status(&bearer, "10.0.0.7", Some(&tokens)), 504);
        assert_eq!(
            status(&bearer, "10.0.0.7", Some(&[])),
            401,
            "an empty token file"
        );
    }

    #[test]
    fn queries_are_percent_decoded_and_plus_stays() {
        let q = Query::parse("topic=a%2Eb&to=time:2024-05-01T14:00:00+02:00&x");
        assert_eq!(q.get("topic"), Some("a.b"));
        assert_eq!(q.get("to"), Some("time:2024-05-01T14:00:00+02:00"));
        assert_eq!(q.get("x"), Some(""));
        assert_eq!(decode("%zz%41"), "%zzA");
    }
}
