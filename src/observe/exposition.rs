//! Which text format a metrics scrape gets: OpenMetrics when the scraper asks for it (Prometheus
//! does, in its `Accept` header), else Prometheus's classic text format 0.0.4, which every other
//! parser and `promtool check metrics` read. The metrics are encoded once, as OpenMetrics (by the
//! `prometheus-client` crate, which writes no other format); [`to_text_004`] rewrites that text.
//!
//! The two differ where a counter is named: OpenMetrics names the family `foo` and its sample
//! `foo_total`, while 0.0.4 has no families, so its `HELP` and `TYPE` lines name `foo_total`
//! (read as written, a classic parser took every counter for an untyped `foo_total` without
//! help). 0.0.4 has no `# UNIT`, no `_created` samples, no `unknown` type (`untyped`) and no
//! `# EOF`.

/// A text format of the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0.
    OpenMetrics,
    /// Prometheus's text format 0.0.4.
    Text004,
}

impl Format {
    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text004 => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The format an `Accept` header asks for: OpenMetrics when it names
/// `application/openmetrics-text` with a quality above 0 and not below that of `text/plain` (or
/// of `*/*`); else the classic text, also without a header.
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else { return Format::Text004 };
    let (mut open, mut text) = (0.0f32, 0.0f32);
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q=").and_then(|q| q.trim().parse::<f32>().ok()))
            .next()
            .unwrap_or(1.0);
        let q = if q.is_finite() { q.clamp(0.0, 1.0) } else { 0.0 };
        match media.as_str() {
            "application/openmetrics-text" => open = open.max(q),
            "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    if open > 0.0 && open >= text {
        Format::OpenMetrics
    } else {
        Format::Text004
    }
}

/// The metrics in `format`, from their OpenMetrics text.
pub fn render(openmetrics: String, format: Format) -> String {
    match format {
        Format::OpenMetrics => openmetrics,
        Format::Text004 => to_text_004(&openmetrics),
    }
}

/// OpenMetrics text rewritten in the classic text format 0.0.4: a counter's `HELP` and `TYPE`
/// name its `_total` sample, `unknown` is `untyped`, and `# UNIT`, `_created` samples and
/// `# EOF` go.
pub fn to_text_004(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, "counter")) = rest.split_once(' ') {
                counters.insert(name.to_string());
            }
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            // OpenMetrics escapes a quote in help text; 0.0.4 does not.
            format!("# HELP {} {}", sample_name(name, &counters), help.replace("\\\"", "\""))
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let kind = if kind == "unknown" { "untyped" } else { kind };
            format!("# TYPE {} {kind}", sample_name(name, &counters))
        } else if line.starts_with('#') {
            line.to_string()
        } else {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            if name.ends_with("_created") {
                continue;
            }
            line.to_string()
        };
        out.push_str(&rewritten);
        out.push('\n');
    }
    out
}

/// The name 0.0.4 gives family `name`: its sample's, `name_total`, for a counter.
fn sample_name(name: &str, counters: &std::collections::HashSet<String>) -> String {
    if counters.contains(name) {
        format!("{name}_total")
    } else {
        name.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_header_chooses_the_format() {
        assert_eq!(negotiate(None), Format::Text004);
        assert_eq!(negotiate(Some("*/*")), Format::Text004);
        assert_eq!(negotiate(Some("text/plain")), Format::Text004);
        // What Prometheus 2.x and 3.x send.
        let prometheus =
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                          text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(negotiate(Some("application/openmetrics-text;q=0, text/plain")), Format::Text004);
        assert_eq!(negotiate(Some("text/plain;q=0.9, application/openmetrics-text;q=0.5")), Format::Text004);
        assert_eq!(negotiate(Some("application/openmetrics-text; q=NaN")), Format::Text004);
        assert_eq!(negotiate(Some("garbage;;;,")), Format::Text004);
    }

    #[test]
    fn counters_are_named_by_their_samples_and_openmetrics_only_lines_go() {
        let om = "# HELP oar_pulls Pull requests served.\n# TYPE oar_pulls counter\noar_pulls_total 3\n\
                  oar_pulls_created 1.7e9\n# HELP oar_rows Rows \\\"held\\\".\n# TYPE oar_rows gauge\noar_rows 5\n\
                  # HELP oar_pull_seconds Pull latency.\n# TYPE oar_pull_seconds histogram\n# UNIT oar_pull_seconds seconds\n\
                  oar_pull_seconds_sum 0.5\noar_pull_seconds_count 2\noar_pull_seconds_bucket{le=\"+Inf\"} 2\n\
                  # TYPE oar_odd unknown\noar_odd 1\n# EOF\n";
        let text = to_text_004(om);
        assert_eq!(
            text,
            "# HELP oar_pulls_total Pull requests served.\n# TYPE oar_pulls_total counter\noar_pulls_total 3\n\
             # HELP oar_rows Rows \"held\".\n# TYPE oar_rows gauge\noar_rows 5\n\
             # HELP oar_pull_seconds Pull latency.\n# TYPE oar_pull_seconds histogram\n\
             oar_pull_seconds_sum 0.5\noar_pull_seconds_count 2\noar_pull_seconds_bucket{le=\"+Inf\"} 2\n\
             # TYPE oar_odd untyped\noar_odd 1\n"
        );
        assert_eq!(render(om.to_string(), Format::OpenMetrics), om);
    }
}
