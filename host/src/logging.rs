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

use serde_json::{Map, Value};
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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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

/// The JSON line format: timestamp, level, message, the fields of every enclosing span (outer
/// first), the event's fields, and the target.
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
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            Value::String(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
        );
        line.insert(
            "level".into(),
            Value::String(event.metadata().level().to_string()),
        );
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>()
                    && let Ok(Value::Object(map)) = serde_json::from_str::<Value>(fields)
                {
                    line.extend(map);
                }
            }
        }
        event.record(&mut Fields(&mut line));
        line.insert(
            "target".into(),
            Value::String(event.metadata().target().into()),
        );
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Records an event's fields into a JSON object.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().into(), Value::String(value.into()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
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
}
