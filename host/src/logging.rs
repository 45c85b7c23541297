//! Logging: `tracing` to stderr, human by default, one JSON object per line on request.
//!
//! Work for a job runs inside a `job` span (`job`, `node`) and, while it leads, a `term` span
//! (`token`), so a log line names them once, where the work starts, not on every line. The
//! human format shows the spans as a prefix (`job{job=recon node=n1}:term{token=7}: step
//! done`); the JSON format puts the fields of every enclosing span at the top level of the
//! line beside the event's own (`{"message":"step done","job":"recon","node":"n1","token":7,
//! …}`), so scripts and the tests read `job`, `node` and `token` from every line about a job
//! without knowing about spans. An event's own field wins over a span's of the same name.

use std::fmt;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Human,
    /// One JSON object per line, span fields flattened in.
    Json,
}

/// Installs the tracing subscriber: human or JSON, filtered by `LEASEHOLD_LOG` or `RUST_LOG`
/// (default `info`).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("LEASEHOLD_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .init(),
    }
}

/// `text`, cut to at most `max` bytes on a character boundary and marked ` [cut]` when it
/// was longer: for text kept for people (guest log lines, error messages in run records).
pub(crate) fn clip(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(" [cut]");
    }
    text
}

/// The JSON line format: timestamp, level, the fields of every enclosing span (outer first),
/// the event's fields (message first), and the target, in that order. Fields of events that
/// come from the `log` crate (`log.target`, …) are not repeated: `log.target` becomes the
/// target.
struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Line::default();
        line.put(
            "timestamp",
            Value::String(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
        );
        line.put("level", Value::String(event.metadata().level().to_string()));
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>()
                    && let Ok(Value::Object(map)) = serde_json::from_str::<Value>(fields)
                {
                    for (k, v) in map {
                        line.put(&k, v);
                    }
                }
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        for (k, v) in fields.0 {
            line.put(&k, v);
        }
        let target = fields
            .1
            .unwrap_or_else(|| event.metadata().target().to_string());
        line.put("target", Value::String(target));
        writeln!(writer, "{}", line.to_json())
    }
}

/// A JSON object whose keys keep the order they were first put in; a later value of a key
/// replaces the earlier one in place.
#[derive(Default)]
struct Line(Vec<(String, Value)>);

impl Line {
    fn put(&mut self, key: &str, value: Value) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key.to_string(), value)),
        }
    }

    fn to_json(&self) -> String {
        let mut out = String::from("{");
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&Value::String(k.clone()).to_string());
            out.push(':');
            out.push_str(&v.to_string());
        }
        out.push('}');
        out
    }
}

/// An event's fields, in order (message first), and the `log.target` of a `log` record.
#[derive(Default)]
struct Fields(Vec<(String, Value)>, Option<String>);

impl Fields {
    fn add(&mut self, field: &Field, value: Value) {
        let name = field.name();
        if name == "log.target" {
            self.1 = value.as_str().map(str::to_string);
        } else if !name.starts_with("log.") {
            self.0.push((name.to_string(), value));
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.add(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.add(field, Value::String(value.into()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.add(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.add(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.add(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.add(field, value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn long_text_is_cut_on_a_character_boundary() {
        let cut = clip("é".repeat(100), 51);
        assert!(cut.ends_with(" [cut]"));
        assert_eq!(cut.len(), 50 + " [cut]".len());
        assert_eq!(clip("short".into(), 51), "short");
    }

    #[test]
    fn a_line_keeps_its_order_and_the_last_value_of_a_key() {
        let mut line = super::Line::default();
        line.put("timestamp", "t".into());
        line.put("level", "INFO".into());
        line.put("token", 1.into());
        line.put("token", 7.into());
        line.put("message", "a \"quoted\" word".into());
        assert_eq!(
            line.to_json(),
            r#"{"timestamp":"t","level":"INFO","token":7,"message":"a \"quoted\" word"}"#
        );
    }
}
