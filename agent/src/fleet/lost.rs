//! `vigil status`'s time lost: each node record's last day, summed per pool and cause.

use std::collections::BTreeMap;

use crate::hang::policy_lost::exact;
use crate::metrics::LOST_CAUSES;

/// Pool → cause → seconds lost in the last 24 hours, from each live node record's (pool, last
/// day) (a node whose record is gone counts nothing: the record carried it).
pub(crate) fn by_pool<'a>(
    records: impl IntoIterator<Item = (&'a str, &'a BTreeMap<String, f64>)>,
) -> BTreeMap<String, BTreeMap<String, f64>> {
    let mut out: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for (pool, lost) in records {
        let pool = if pool.is_empty() { "-" } else { pool };
        let e = out.entry(pool.to_string()).or_default();
        for (cause, s) in lost {
            *e.entry(cause.clone()).or_default() += s;
        }
    }
    out
}

/// The table: a row per pool, a column per cause. No total: the causes count different things
/// (worker-seconds for hang, error and restart; node-seconds for maintenance and preemption;
/// GPU-seconds for gpu-failed).
pub(crate) fn render(pools: &BTreeMap<String, BTreeMap<String, f64>>) -> String {
    if pools.values().all(|c| c.values().all(|&s| s <= 0.0)) {
        return "\ntime lost in the last 24 h: none\n".into();
    }
    let mut out = format!(
        "\ntime lost in the last 24 h (hang, error, restart: per worker; maintenance, preemption: per node; gpu-failed: per GPU; slow: per gang member)\n{:<16}",
        "POOL"
    );
    for cause in LOST_CAUSES {
        out.push_str(&format!(" {:>12}", cause.to_uppercase()));
    }
    out.push('\n');
    for (pool, causes) in pools {
        out.push_str(&format!("{pool:<16}"));
        for cause in LOST_CAUSES {
            let s = causes.get(cause).copied().unwrap_or(0.0);
            let cell = if s <= 0.0 { "-".into() } else { exact((s * 1000.0).round() as i64) };
            out.push_str(&format!(" {cell:>12}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(lost: &[(&str, f64)]) -> BTreeMap<String, f64> {
        lost.iter().map(|(c, s)| (c.to_string(), *s)).collect()
    }

    #[test]
    fn each_pool_sums_its_nodes_by_cause() {
        let (a, b, c) = (
            day(&[("hang", 130.0), ("restart", 42.5)]),
            day(&[("hang", 20.0), ("preemption", 100.0)]),
            day(&[]),
        );
        let pools = by_pool([("a3-mega", &a), ("a3-mega", &b), ("", &c)]);
        assert_eq!(pools["a3-mega"]["hang"], 150.0);
        assert_eq!(pools["a3-mega"]["preemption"], 100.0);
        let text = render(&pools);
        let row = text.lines().find(|l| l.starts_with("a3-mega")).unwrap();
        assert!(row.contains("2m 30s"), "{row}");
        assert!(row.contains("42.5s"), "{row}");
        assert!(row.contains("1m 40s"), "{row}");
        assert!(text.lines().any(|l| l.starts_with("- ")), "{text}");
        assert!(render(&BTreeMap::new()).contains("none"));
    }
}
