//! The classic Prometheus text format, derived from OpenMetrics text.

/// The classic Prometheus text format (0.0.4) from OpenMetrics text, for scrapers and tools
/// that do not speak OpenMetrics (`promtool check metrics`, `curl`): counter families are named
/// with their `_total` suffix, and the OpenMetrics-only `# UNIT` and `# EOF` lines are dropped.
pub fn to_classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}
