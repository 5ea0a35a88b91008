//! `GET /topics/NAME/partitions/P/records?from=SEQ|from_time=MS&max=N`: a page of one
//! partition's records (a source topic's or its `NAME.dlq` twin's), read without a
//! group, so nothing is acknowledged or moved. The reactor copies a bounded page
//! ([`crate::broker::peek`]); this file parses the request and renders the page as JSON
//! on the admin thread. The shape is in docs/DECISIONS.md ("Reading records over admin
//! HTTP") and man/mortard.8.

use base64::Engine as _;

use super::http::Request;
use super::{AdminAnswer, AdminAsk, Json};
use crate::broker::peek::{Peek, PeekAsk, PeekError, PeekFrom, PeekRecord};
use crate::broker::topics::valid_name;
use crate::wire::{ErrorCode, DLQ_SUFFIX};

/// Records a page holds when the request names no `max`.
pub const RECORDS_DEFAULT: usize = 100;
/// A record's `encoding`: key and value are both valid UTF-8 and shown as they are…
pub const ENCODING_TEXT: &str = "text";
/// …or at least one is not, and both are standard base64 (RFC 4648, padded).
pub const ENCODING_BASE64: &str = "base64";

/// (status, content type, body), as the other routes answer.
type Answer = (u16, &'static str, String);

/// The answer for a records request, or `None` when `request` is not one (another
/// route's path). `ask` sends the reactor its question and waits a bounded time.
pub(super) fn answer(
    request: &Request,
    ask: impl FnOnce(AdminAsk) -> Option<AdminAnswer>,
) -> Option<Answer> {
    let (topic, partition) = records_path(&request.path)?;
    if request.method != tiny_http::Method::Get {
        return Some(error(
            405,
            "METHOD_NOT_ALLOWED",
            None,
            "only GET reads records",
        ));
    }
    let (peek, pretty) = match parse(topic, partition, &request.query) {
        Ok(parsed) => parsed,
        Err(e) => return Some(refusal(&e)),
    };
    Some(match ask(AdminAsk::Records(peek)) {
        Some(AdminAnswer::Records(Ok(page))) => {
            (200, "application/json", render_records(&page, pretty))
        }
        Some(AdminAnswer::Records(Err(e))) => refusal(&e),
        _ => error(
            503,
            "UNAVAILABLE",
            None,
            "the reactor did not answer in time; retry",
        ),
    })
}

/// `/topics/NAME/partitions/P/records` → (NAME, P), both unchecked.
fn records_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/topics/")?.strip_suffix("/records")?;
    let (topic, partition) = rest.split_once("/partitions/")?;
    (!partition.contains('/')).then_some((topic, partition))
}

/// The reactor's question, and whether to indent the answer; refusals are
/// INVALID_ARGUMENT or INVALID_TOPIC_NAME with a sentence naming the parameter.
fn parse(topic: &str, partition: &str, query: &str) -> Result<(PeekAsk, bool), PeekError> {
    let source = topic.strip_suffix(DLQ_SUFFIX).unwrap_or(topic);
    if !valid_name(source.as_bytes()) {
        let text = format!("'{topic}' is not a topic name (1-255 of A-Z a-z 0-9 . _ -)");
        return Err(invalid(ErrorCode::InvalidTopicName, text));
    }
    let partition = number::<u16>("partition", partition)?;
    let (mut from, mut max, mut pretty) = (None, RECORDS_DEFAULT, false);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let at = match name {
            "from" => PeekFrom::Sequence(number("from", value)?),
            "from_time" => PeekFrom::TimeMs(number("from_time", value)?),
            "max" => {
                max = number("max", value)?;
                if max == 0 {
                    return Err(argument("max=0 asks for no records; give 1 or more".into()));
                }
                continue;
            }
            "pretty" => {
                pretty = matches!(value, "" | "1" | "true");
                continue;
            }
            _ => {
                let text = format!("unknown parameter '{name}' (from, from_time, max, pretty)");
                return Err(argument(text));
            }
        };
        if from.replace(at).is_some() {
            return Err(argument("give one of from and from_time, once".into()));
        }
    }
    let ask = PeekAsk {
        topic: topic.to_string(),
        partition,
        from: from.unwrap_or(PeekFrom::Sequence(0)),
        max_records: max,
    };
    Ok((ask, pretty))
}

fn number<T: std::str::FromStr>(name: &str, text: &str) -> Result<T, PeekError> {
    text.parse()
        .map_err(|_| argument(format!("{name}: '{text}' is not a whole number in range")))
}

fn argument(message: String) -> PeekError {
    invalid(ErrorCode::InvalidArgument, message)
}

fn invalid(code: ErrorCode, message: String) -> PeekError {
    PeekError { code, message }
}

/// A refusal as JSON: 404 for a topic that does not exist, 503 for a read to retry,
/// 400 for anything the request got wrong.
fn refusal(e: &PeekError) -> Answer {
    let status = match e.code {
        ErrorCode::UnknownTopic => 404,
        ErrorCode::InternalError => 503,
        _ => 400,
    };
    error(status, e.code.name(), Some(e.code), &e.message)
}

/// `{"error": NAME, "code": N, "message": TEXT}`; `code` only for a registry error.
fn error(status: u16, name: &str, code: Option<ErrorCode>, message: &str) -> Answer {
    let mut fields = vec![("error", Json::Str(name.to_string()))];
    if let Some(code) = code {
        fields.push(("code", Json::Num(u64::from(code.code()))));
    }
    fields.push(("message", Json::Str(message.to_string())));
    (
        status,
        "application/json",
        Json::Obj(fields).render(false) + "\n",
    )
}

/// A page as the endpoint answers it.
pub fn render_records(page: &Peek, pretty: bool) -> String {
    let mut fields = vec![
        ("topic", Json::Str(page.topic.clone())),
        ("dlq_twin", Json::Bool(page.dlq_twin)),
        ("partition", Json::Num(u64::from(page.partition))),
        ("partitions", Json::Num(u64::from(page.partition_count))),
        ("first_sequence", Json::Num(page.first_sequence)),
        ("last_sequence", Json::Num(page.last_sequence)),
        ("next", Json::Num(page.next_sequence)),
        (
            "records",
            Json::Arr(page.records.iter().map(record).collect()),
        ),
    ];
    if !page.corrupt.is_empty() {
        let skipped = page.corrupt.iter().map(|s| Json::Num(*s)).collect();
        fields.push(("corrupt", Json::Arr(skipped)));
    }
    let mut body = Json::Obj(fields).render(pretty);
    if !pretty {
        body.push('\n');
    }
    body
}

fn record(r: &PeekRecord) -> Json {
    let (encoding, key, value) = match (std::str::from_utf8(&r.key), std::str::from_utf8(&r.value))
    {
        (Ok(k), Ok(v)) => (ENCODING_TEXT, k.to_string(), v.to_string()),
        _ => {
            let b64 = base64::engine::general_purpose::STANDARD;
            (ENCODING_BASE64, b64.encode(&r.key), b64.encode(&r.value))
        }
    };
    let mut fields = vec![
        ("sequence", Json::Num(r.sequence)),
        ("timestamp_ms", Json::Num(r.timestamp_ms)),
        ("encoding", Json::Str(encoding.to_string())),
        ("key", Json::Str(key)),
        ("value", Json::Str(value)),
    ];
    if let Some(o) = &r.origin {
        let origin = Json::Obj(vec![
            ("topic", Json::Str(o.topic.clone())),
            ("partition", Json::Num(u64::from(o.partition))),
            ("sequence", Json::Num(o.sequence)),
            ("reason", Json::Str(o.reason.to_string())),
            ("attempts", Json::Num(u64::from(o.attempts))),
            ("group", Json::Str(o.group.clone())),
        ]);
        fields.push(("origin", origin));
    }
    Json::Obj(fields)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::peek::PeekOrigin;

    fn page(records: Vec<PeekRecord>) -> Peek {
        Peek {
            topic: "jobs.dlq".into(),
            topic_id: 2,
            dlq_twin: true,
            partition: 0,
            partition_count: 3,
            first_sequence: 1,
            last_sequence: 9,
            next_sequence: 3,
            records,
            corrupt: Vec::new(),
        }
    }

    fn rec(sequence: u64, key: &[u8], value: &[u8]) -> PeekRecord {
        PeekRecord {
            sequence,
            timestamp_ms: 1_700_000_000_123,
            key: key.to_vec(),
            value: value.to_vec(),
            origin: None,
        }
    }

    #[test]
    fn text_stays_text_and_anything_else_is_base64_with_the_origin() {
        let mut dead = rec(2, b"k", &[0xff, 0x00, b'a']);
        dead.origin = Some(PeekOrigin {
            topic_id: 1,
            topic: "jobs".into(),
            partition: 0,
            sequence: 7,
            attempts: 2,
            reason: "REJECTED",
            group: "workers".into(),
        });
        let body = render_records(
            &page(vec![rec(1, b"", "h\u{e9}\"\n".as_bytes()), dead]),
            false,
        );
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(doc["topic"], "jobs.dlq");
        assert_eq!(
            (doc["dlq_twin"].as_bool(), doc["partitions"].as_u64()),
            (Some(true), Some(3))
        );
        assert_eq!(
            (
                doc["first_sequence"].as_u64(),
                doc["last_sequence"].as_u64()
            ),
            (Some(1), Some(9))
        );
        assert_eq!(doc["next"], 3);
        let r = &doc["records"];
        assert_eq!(r[0]["encoding"], ENCODING_TEXT);
        assert_eq!(
            (r[0]["key"].as_str(), r[0]["value"].as_str()),
            (Some(""), Some("h\u{e9}\"\n"))
        );
        assert_eq!(r[0]["timestamp_ms"], 1_700_000_000_123u64);
        assert!(r[0].get("origin").is_none());
        assert_eq!(r[1]["encoding"], ENCODING_BASE64);
        assert_eq!(
            (r[1]["key"].as_str(), r[1]["value"].as_str()),
            (Some("aw=="), Some("/wBh"))
        );
        let o = &r[1]["origin"];
        assert_eq!(
            (o["topic"].as_str(), o["partition"].as_u64()),
            (Some("jobs"), Some(0))
        );
        assert_eq!(
            (o["sequence"].as_u64(), o["attempts"].as_u64()),
            (Some(7), Some(2))
        );
        assert_eq!(
            (o["reason"].as_str(), o["group"].as_str()),
            (Some("REJECTED"), Some("workers"))
        );
        assert!(doc.get("corrupt").is_none());
        let mut damaged = page(Vec::new());
        damaged.corrupt = vec![4];
        assert!(render_records(&damaged, true).contains("\"corrupt\": [\n    4\n  ]"));
    }

    #[test]
    fn only_records_paths_are_taken_and_bad_parameters_are_named() {
        assert_eq!(
            records_path("/topics/a.dlq/partitions/2/records"),
            Some(("a.dlq", "2"))
        );
        assert_eq!(records_path("/topics/a/partitions/2/records/x"), None);
        assert_eq!(records_path("/topics/a/partitions/2/x/records"), None);
        assert_eq!(records_path("/topics/a"), None);
        assert_eq!(records_path("/stats"), None);
        let (ask, pretty) = parse("t", "1", "from_time=5&max=7&pretty").unwrap();
        assert_eq!(
            (ask.partition, ask.from, ask.max_records, pretty),
            (1, PeekFrom::TimeMs(5), 7, true)
        );
        let (ask, _) = parse("t", "0", "").unwrap();
        assert_eq!(
            (ask.from, ask.max_records),
            (PeekFrom::Sequence(0), RECORDS_DEFAULT)
        );
        for (topic, partition, query, code, says) in [
            ("t", "x", "", ErrorCode::InvalidArgument, "partition: 'x'"),
            (
                "t",
                "70000",
                "",
                ErrorCode::InvalidArgument,
                "partition: '70000'",
            ),
            (
                "t",
                "0",
                "from=-1",
                ErrorCode::InvalidArgument,
                "from: '-1'",
            ),
            ("t", "0", "max=0", ErrorCode::InvalidArgument, "max=0"),
            (
                "t",
                "0",
                "from=1&from_time=2",
                ErrorCode::InvalidArgument,
                "one of from",
            ),
            (
                "t",
                "0",
                "form=1",
                ErrorCode::InvalidArgument,
                "unknown parameter 'form'",
            ),
            ("b%20d", "0", "", ErrorCode::InvalidTopicName, "'b%20d'"),
        ] {
            let e = parse(topic, partition, query).unwrap_err();
            assert_eq!(e.code, code, "{query}");
            assert!(e.message.contains(says), "{}", e.message);
        }
        let (status, _, body) = refusal(&invalid(ErrorCode::UnknownTopic, "no".into()));
        assert_eq!(
            (status, body.as_str()),
            (
                404,
                "{\"error\":\"UNKNOWN_TOPIC\",\"code\":8,\"message\":\"no\"}\n"
            )
        );
    }
}
