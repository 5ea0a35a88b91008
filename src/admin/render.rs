//! `/metrics` (Prometheus text format 0.0.4) and `/stats` (JSON), both walks of
//! [`METRICS`].

use std::borrow::Cow;
use std::fmt::{Display, Write as _};

use super::{Metric, Read, Snapshot, Unit, METRICS, STATS_SECTIONS};
use crate::logging::json_string;

/// Prometheus shows time in seconds; whole milliseconds become whole seconds, as
/// `mortar_uptime_seconds` always has.
const MILLISECONDS_PER_SECOND: u64 = 1_000;
/// Decimal places of a second in a millisecond and a microsecond.
const MILLISECOND_DIGITS: usize = 3;
const MICROSECOND_DIGITS: usize = 6;

pub fn render_metrics(s: &Snapshot) -> String {
    let mut out = String::new();
    for m in METRICS.iter().filter(|m| m.shown(s)) {
        let Some(name) = m.family else { continue };
        let (help, kind) = (m.help, m.kind.name());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        histogram(&mut out, name, m, s);
        for point in m.read.points(s) {
            if let Some(value) = sample_value(m.unit, point.value) {
                sample(&mut out, name, &point.labels, value);
            }
        }
    }
    out
}

/// Text is never a sample (Info rows have no family), nor is a holder of entities.
fn sample_value(unit: Unit, value: Option<Json>) -> Option<String> {
    match value? {
        Json::Num(n) if unit == Unit::Milliseconds => {
            Some((n / MILLISECONDS_PER_SECOND).to_string())
        }
        Json::Num(n) => Some(in_seconds(n, unit)),
        Json::Float(f) => Some(f.to_string()),
        Json::Bool(b) => Some(u8::from(b).to_string()),
        Json::Null | Json::Str(_) | Json::Arr(_) | Json::Obj(_) => None,
    }
}

fn histogram(out: &mut String, name: &str, m: &Metric, s: &Snapshot) {
    let Read::Histogram {
        bounds,
        counts,
        sum,
    } = &m.read
    else {
        return;
    };
    let mut cumulative = 0;
    for (i, count) in counts(s).iter().enumerate() {
        cumulative += count;
        let le = bounds
            .get(i)
            .map_or("+Inf".to_string(), |b| in_seconds(*b, m.unit));
        sample(
            out,
            &format!("{name}_bucket"),
            &[("le", le.into())],
            cumulative,
        );
    }
    sample(out, &format!("{name}_sum"), &[], in_seconds(sum(s), m.unit));
    sample(out, &format!("{name}_count"), &[], cumulative);
}

/// `n` of `unit` as Prometheus shows it: a time in seconds, written from the integer
/// as a decimal (0.025, never the 0.024999999999999998 of `25e3 as f64 * 1e-6`), so
/// bucket bounds match what dashboards and recording rules name.
pub fn in_seconds(n: u64, unit: Unit) -> String {
    let digits = match unit {
        Unit::Milliseconds => MILLISECOND_DIGITS,
        Unit::Microseconds => MICROSECOND_DIGITS,
        _ => return n.to_string(),
    };
    let text = format!("{n:0>width$}", width = digits + 1);
    let (whole, fraction) = text.split_at(text.len() - digits);
    match fraction.trim_end_matches('0') {
        "" => whole.to_string(),
        fraction => format!("{whole}.{fraction}"),
    }
}

pub(super) fn sample(
    out: &mut String,
    name: &str,
    labels: &[(&str, Cow<str>)],
    value: impl Display,
) {
    out.push_str(name);
    for (i, (k, v)) in labels.iter().enumerate() {
        out.push(if i == 0 { '{' } else { ',' });
        let v = v
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(out, "{k}=\"{v}\"");
    }
    if !labels.is_empty() {
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// The rows `/stats` shows, in document order: by section ([`STATS_SECTIONS`]), then
/// in table order. Building the document in this order gives it its key order.
pub fn in_stats_order() -> Vec<&'static Metric> {
    let section = |m: &&Metric| {
        let top = m.path.and_then(|p| p.split(['.', '[']).next());
        STATS_SECTIONS.iter().position(|s| Some(*s) == top)
    };
    let mut rows: Vec<&'static Metric> = METRICS.iter().filter(|m| m.path.is_some()).collect();
    rows.sort_by_key(section);
    rows
}

pub fn render_stats(s: &Snapshot, pretty: bool) -> String {
    let mut doc = Json::Obj(Vec::new());
    for m in in_stats_order().into_iter().filter(|m| m.shown(s)) {
        let steps: Vec<&'static str> = m.path.unwrap_or_default().split('.').collect();
        match &m.read {
            Read::Scalar(read) => put(&mut doc, &steps, &[], Some(read(s))),
            Read::ByLabel(_, read) => {
                let counts = read(s).into_iter().map(|(k, n)| (k, Json::Num(n)));
                put(&mut doc, &steps, &[], Some(Json::Obj(counts.collect())));
            }
            Read::ClusterByLabel(_, read) => {
                let counts = s.cluster.as_ref().map_or(&[][..], read);
                let counts = counts.iter().map(|&(k, n)| (k, Json::Num(n)));
                put(&mut doc, &steps, &[], Some(Json::Obj(counts.collect())));
            }
            read => {
                put(&mut doc, &steps, &[], None);
                for point in read.points(s) {
                    put(&mut doc, &steps, &point.at, point.value);
                }
            }
        }
    }
    doc.render(pretty)
}

/// Walks `steps`, adding what is missing and entering element `at[k]` of the k-th
/// array; sets `value` at the end. Without a value it stops at the first array it has
/// no element for, having made that array.
fn put(mut node: &mut Json, steps: &[&'static str], at: &[usize], value: Option<Json>) {
    let mut at = at.iter();
    for step in steps {
        let key = step.trim_end_matches("[]");
        let Json::Obj(fields) = node else {
            unreachable!("/stats path step {step} below a value that is not an object");
        };
        let field = fields.iter().position(|(k, _)| *k == key);
        let field = field.unwrap_or_else(|| {
            fields.push((key, Json::Obj(Vec::new())));
            fields.len() - 1
        });
        node = &mut fields[field].1;
        if key.len() < step.len() {
            if !matches!(node, Json::Arr(_)) {
                *node = Json::Arr(Vec::new());
            }
            let (Json::Arr(items), Some(&i)) = (node, at.next()) else {
                return;
            };
            if items.len() <= i {
                items.resize_with(i + 1, || Json::Obj(Vec::new()));
            }
            node = &mut items[i];
        }
    }
    if let Some(value) = value {
        *node = value;
    }
}

/// A JSON value, rendered with correct string escaping (compact or pretty).
pub enum Json {
    /// A figure the broker does not have (a peer never heard from).
    Null,
    Num(u64),
    Float(f64),
    Bool(bool),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(&'static str, Json)>),
}

impl Json {
    pub fn render(&self, pretty: bool) -> String {
        let mut out = String::new();
        self.write(&mut out, pretty, 0);
        if pretty {
            out.push('\n');
        }
        out
    }

    fn write(&self, out: &mut String, pretty: bool, depth: usize) {
        match self {
            Json::Num(n) => {
                let _ = write!(out, "{n}");
            }
            Json::Float(f) if f.is_finite() => {
                let _ = write!(out, "{f}");
            }
            Json::Float(_) | Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Str(s) => json_string(out, s),
            Json::Arr(items) => {
                let items = items.iter().map(|v| (None, v));
                write_list(out, pretty, depth, ('[', ']'), items);
            }
            Json::Obj(fields) => {
                let fields = fields.iter().map(|(k, v)| (Some(*k), v));
                write_list(out, pretty, depth, ('{', '}'), fields);
            }
        }
    }
}

/// An array or object: when pretty, one item a line, indented two spaces a level.
fn write_list<'a>(
    out: &mut String,
    pretty: bool,
    depth: usize,
    (open, close): (char, char),
    items: impl ExactSizeIterator<Item = (Option<&'a str>, &'a Json)>,
) {
    let newline = |out: &mut String, depth: usize| {
        if pretty {
            out.push('\n');
            out.push_str(&"  ".repeat(depth));
        }
    };
    let empty = items.len() == 0;
    out.push(open);
    for (i, (key, value)) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        newline(out, depth + 1);
        if let Some(key) = key {
            json_string(out, key);
            out.push_str(if pretty { ": " } else { ":" });
        }
        value.write(out, pretty, depth + 1);
    }
    if !empty {
        newline(out, depth);
    }
    out.push(close);
}
