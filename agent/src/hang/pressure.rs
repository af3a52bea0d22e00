//! The host's CPU and memory pressure and CPU steal (issue 45, fail-slow's evidence from the
//! host): a starved host slows its rank as surely as a clocked-down GPU. Read from procfs once a
//! cycle while `gang.pace` is on: PSI's `some avg60` of `/proc/pressure/cpu` and
//! `/proc/pressure/memory` (the share of the last minute in which some task waited for a CPU, or
//! for memory) and the share of CPU time stolen by the hypervisor over the last minute or so
//! (`/proc/stat`, a VM's vCPU given to another guest). A kernel without PSI, or a read that
//! fails, says nothing. Like every signal, it names a member only when a minority of the
//! gang's nodes show it (`crate::hang::policy_pace::suspect_scored`).

use std::path::PathBuf;

use crate::clock::Millis;

/// PSI `some avg60` from which CPU pressure is a slowdown, %.
const CPU_PRESSURE: f64 = 20.0;
/// PSI `some avg60` from which memory pressure is a slowdown, %.
const MEMORY_PRESSURE: f64 = 10.0;
/// The share of CPU time stolen from which steal is a slowdown, %.
const STEAL: f64 = 5.0;
/// Steal is measured over at least this long, and at least this much CPU time (ten CPU-seconds
/// at the kernel's 100 ticks a second: a clock that jumps is no measure).
const STEAL_SPAN: Millis = 60_000;
const STEAL_TICKS: u64 = 1_000;

/// CPU time in ticks since boot: all of it, and what the hypervisor stole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuTimes {
    total: u64,
    steal: u64,
}

/// The host's pressure as the cycle reads it.
#[derive(Debug, educe::Educe)]
#[educe(Default)]
pub(crate) struct HostPressure {
    #[educe(Default(expression = "/proc".into()))]
    root: PathBuf,
    /// The last steal measure's start, and the share it found.
    mark: Option<(Millis, CpuTimes)>,
    steal: Option<f64>,
}

impl HostPressure {
    /// Reading procfs at `root` (a directory of the same files in tests; `/proc` is the default).
    #[cfg(any(test, feature = "bench"))]
    pub(crate) fn at(root: impl Into<PathBuf>) -> Self {
        HostPressure { root: root.into(), mark: None, steal: None }
    }

    /// Whether the hypervisor steals the host's CPU time (as the last [`HostPressure::signals`]
    /// measured it): the one host signal no workload on the host causes.
    pub(crate) fn stolen(&self) -> bool {
        self.steal.is_some_and(|s| s >= STEAL)
    }

    /// What of the host slows its workers down now (`now`: the cycle's clock), e.g.
    /// `host CPU pressure 31 % (PSI some avg60)`.
    pub(crate) fn signals(&mut self, now: Millis) -> Vec<String> {
        let read = |p: &str| std::fs::read_to_string(self.root.join(p)).ok();
        let mut out = Vec::new();
        let psi =
            [("pressure/cpu", "CPU", CPU_PRESSURE), ("pressure/memory", "memory", MEMORY_PRESSURE)];
        for (file, what, line) in psi {
            if let Some(v) = read(file).and_then(|t| psi_some_avg60(&t)).filter(|v| *v >= line) {
                out.push(format!("host {what} pressure {v:.0} % (PSI some avg60)"));
            }
        }
        // A new measure of steal once `STEAL_SPAN` has passed since the last (the mark set when
        // there is none or it is from the future, both cleared when /proc/stat is unreadable).
        match (read("stat").and_then(|t| cpu_times(&t)), self.mark) {
            (Some(t), Some((at, m))) if now - at >= STEAL_SPAN => {
                let total = t.total.saturating_sub(m.total);
                let steal = t.steal.saturating_sub(m.steal);
                self.steal = (total >= STEAL_TICKS).then(|| 100.0 * steal as f64 / total as f64);
                self.mark = Some((now, t));
            }
            (Some(_), Some((at, _))) if now >= at => {}
            (Some(t), _) => self.mark = Some((now, t)),
            // NB: a reading that cannot be renewed is no evidence any more.
            (None, _) => (self.mark, self.steal) = (None, None),
        }
        if let Some(s) = self.steal.filter(|s| *s >= STEAL) {
            out.push(format!("host CPU steal {s:.0} % over the last minute"));
        }
        out
    }
}

/// `some avg60` of a PSI file (`some avg10=0.00 avg60=31.20 avg300=… total=…`).
pub(crate) fn psi_some_avg60(text: &str) -> Option<f64> {
    let some = text.lines().find(|l| l.starts_with("some "))?;
    some.split_whitespace().find_map(|f| f.strip_prefix("avg60="))?.parse().ok()
}

/// The `cpu` line of `/proc/stat`: user nice system idle iowait irq softirq steal …
pub(crate) fn cpu_times(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> =
        line.split_whitespace().skip(1).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    // NB: guest and guest_nice (fields 9 and 10) are already counted in user and nice.
    let total = f.iter().take(8).sum();
    Some(CpuTimes { total, steal: *f.get(7)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &std::path::Path, cpu: &str, memory: &str, stat: &str) {
        std::fs::create_dir_all(dir.join("pressure")).unwrap();
        std::fs::write(dir.join("pressure/cpu"), cpu).unwrap();
        std::fs::write(dir.join("pressure/memory"), memory).unwrap();
        std::fs::write(dir.join("stat"), stat).unwrap();
    }

    const QUIET_CPU: &str = "some avg10=1.00 avg60=2.50 avg300=1.00 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    const QUIET_MEMORY: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";

    #[test]
    fn a_starved_host_is_named_and_a_quiet_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let stat = |steal: u64, total_rest: u64| {
            format!("cpu  {total_rest} 0 0 0 0 0 0 {steal} 50 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
        };
        write(dir.path(), QUIET_CPU, QUIET_MEMORY, &stat(0, 10_000));
        let mut h = HostPressure::at(dir.path());
        assert!(h.signals(0).is_empty());
        // A minute later: 1,200 of 10,000 ticks stolen, the CPU pressed, memory quiet.
        let busy = "some avg10=40.00 avg60=31.20 avg300=9.00 total=9\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        write(dir.path(), busy, QUIET_MEMORY, &stat(1_200, 18_800));
        assert_eq!(
            h.signals(60_000),
            vec![
                "host CPU pressure 31 % (PSI some avg60)".to_string(),
                "host CPU steal 12 % over the last minute".to_string(),
            ]
        );
        // No PSI (an old kernel), no steal since: nothing.
        std::fs::remove_dir_all(dir.path().join("pressure")).unwrap();
        std::fs::write(dir.path().join("stat"), stat(1_200, 28_800)).unwrap();
        assert!(h.signals(120_000).is_empty());
    }

    #[test]
    fn this_machines_procfs_reads() {
        let stat = std::fs::read_to_string("/proc/stat").unwrap();
        let t = cpu_times(&stat).expect("a Linux /proc/stat has a cpu line with steal");
        assert!(t.total > 0 && t.steal <= t.total);
        // NB: PSI needs CONFIG_PSI (and psi=1 on some kernels): where the file is there, it reads.
        if let Ok(cpu) = std::fs::read_to_string("/proc/pressure/cpu") {
            let v = psi_some_avg60(&cpu).expect("some avg60");
            assert!((0.0..=100.0).contains(&v), "{v}");
        }
    }

    #[test]
    fn psi_and_stat_lines_are_read_as_the_kernel_writes_them() {
        assert_eq!(psi_some_avg60(QUIET_CPU), Some(2.5));
        assert_eq!(psi_some_avg60("full avg10=1 avg60=2 avg300=3 total=4\n"), None);
        assert_eq!(psi_some_avg60(""), None);
        let t = cpu_times("cpu  10 1 5 100 2 0 1 7 3 0\n").unwrap();
        assert_eq!((t.total, t.steal), (126, 7));
        assert_eq!(cpu_times("cpu  10 1 5\n"), None, "a kernel without steal");
        assert_eq!(cpu_times("intr 1 2\n"), None);
    }
}
