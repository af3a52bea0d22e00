//! What of a GPU's state slows a job on it down (pure; issue 45, fail-slow): the evidence a slow
//! gang's page names a member by (`crate::hang::policy_pace::suspect_scored`, where a signal counts only
//! when a minority of the members' nodes show it). Per GPU:
//!
//! - NVML's clock-event reasons that cut its clocks: `hw-slowdown`, `hw-thermal`, `sw-thermal`,
//!   `hw-power-brake` (not `sw-power-cap`: a GPU at full load sits at its cap by design);
//! - its SM clock below 70 % of its maximum while it is at least half busy (an idle GPU clocks
//!   down by design);
//! - a counter rising within the last five minutes: PCIe replays (a link retrying), NVLink
//!   errors (replay, recovery and CRC, summed over the active links), corrected ECC errors;
//! - an XID within `gpu.evidence_window`.

use crate::accel::gpu::model::{chosen, label, GpuReport, GpuSample, GpuStatus, Rise};
use crate::accel::gpu::policy_xid::{action_for, XidOverrides};

/// Throttle reasons that slow a GPU down, as NVML names them (`crate::accel::gpu::nvml`).
const SLOWDOWNS: [&str; 4] = ["hw-slowdown", "hw-thermal", "sw-thermal", "hw-power-brake"];

/// How long a counter's rise stays evidence: a slow run is judged over minutes.
pub(crate) const RISE_WINDOW_MS: i64 = 5 * 60_000;

/// An SM clock below this share of its maximum, under load, is a slowdown.
const LOW_CLOCK: f64 = 0.7;
/// The load that makes a low clock a slowdown.
const BUSY: f64 = 0.5;

/// Fold the GPU's new sample (`g.sample`) into its rises, against its previous sample `prev`
/// (none: a GPU first seen). A counter that went down (a reset, a driver reload) is no rise.
pub(crate) fn follow_rises(g: &mut GpuStatus, prev: Option<&GpuSample>, now_ms: i64) {
    g.rises.retain(|r| now_ms - r.at_ms <= RISE_WINDOW_MS);
    let Some(p) = prev else { return };
    let s = &g.sample;
    let counters = [
        ("PCIe replays", p.pcie_replays, s.pcie_replays),
        ("NVLink errors", p.nvlink_errors, s.nvlink_errors),
        ("corrected ECC errors", p.ecc_volatile_corrected, s.ecc_volatile_corrected),
    ];
    for (what, before, after) in counters {
        let Some((b, a)) = before.zip(after).filter(|(b, a)| a > b) else { continue };
        match g.rises.iter_mut().find(|r| r.what == what) {
            Some(r) => (r.by, r.at_ms) = (r.by + (a - b), now_ms),
            None => g.rises.push(Rise { what, by: a - b, at_ms: now_ms }),
        }
    }
}

/// Why one GPU slows a job down now, in words (empty: nothing does).
fn why_slow(g: &GpuStatus) -> Vec<String> {
    let s = &g.sample;
    let slowdowns = s.throttle_reasons.iter().filter(|r| SLOWDOWNS.contains(r));
    let mut why: Vec<String> = slowdowns.map(|r| r.to_string()).collect();
    if let (Some(sm), Some(max), Some(busy)) = (s.sm_clock_mhz, s.sm_clock_max_mhz, s.utilization) {
        if max > 0 && busy >= BUSY && f64::from(sm) < LOW_CLOCK * f64::from(max) {
            why.push(format!("SM clock {sm} of {max} MHz"));
        }
    }
    why.extend(g.rises.iter().map(|r| format!("{} +{}", r.what, r.by)));
    let xids: std::collections::BTreeSet<u64> = g.recent_xids.iter().map(|(x, _)| *x).collect();
    why.extend(xids.iter().map(|x| format!("XID {x}")));
    why
}

/// What slows a worker on these GPUs down now (indices or UUIDs; `None` or `all` = every GPU of
/// the node): `GPU 0 (GPU-…) hw-slowdown, PCIe replays +40`, one line per GPU.
pub fn slow_signals(report: &GpuReport, gpus: Option<&[String]>) -> Vec<String> {
    chosen(report, gpus)
        .filter_map(|g| {
            let why = why_slow(g);
            (!why.is_empty()).then(|| format!("{} {}", label(g.index, &g.uuid), why.join(", ")))
        })
        .collect()
}

/// Throttle reasons no workload causes: the system's power brake. NB: not `hw-slowdown`, which
/// NVIDIA documents as raised by a temperature or power draw too high too (a power-heavy kernel
/// raises it), nor the thermal ones: each follows the load as much as the machine.
const MACHINE_SLOWDOWNS: [&str; 1] = ["hw-power-brake"];

/// Whether these GPUs show a slowdown their workload cannot cause: a [`MACHINE_SLOWDOWNS`]
/// reason, a link or ECC counter rising, an XID whose action fails the GPU. NB: what may evict
/// every pod of a shared node (`gang.pace.taint = "NoExecute"`) must not be a tenant's to
/// cause: a kernel's bad access (XID 13, 31), a hot loop's clocks or thermals are.
pub fn machine_slow(report: &GpuReport, gpus: Option<&[String]>, xids: &XidOverrides) -> bool {
    chosen(report, gpus).any(|g| {
        let reasons = &g.sample.throttle_reasons;
        let xid_fails = |&(x, _): &(u64, i64)| action_for(x, xids).is_some_and(|a| a.fails());
        reasons.iter().any(|r| MACHINE_SLOWDOWNS.contains(r))
            || !g.rises.is_empty()
            || g.recent_xids.iter().any(xid_fails)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(sample: GpuSample) -> GpuStatus {
        GpuStatus { index: 0, uuid: "GPU-a".into(), sample, ..GpuStatus::default() }
    }

    fn report(g: GpuStatus) -> GpuReport {
        GpuReport { gpus: vec![g], ..GpuReport::default() }
    }

    #[test]
    fn rising_counters_are_evidence_for_five_minutes_and_a_reset_is_not_a_rise() {
        let s0 = GpuSample {
            pcie_replays: Some(10),
            nvlink_errors: Some(0),
            ecc_volatile_corrected: Some(3),
            ..GpuSample::default()
        };
        let mut g = gpu(s0.clone());
        follow_rises(&mut g, None, 0);
        assert!(slow_signals(&report(g.clone()), None).is_empty(), "first seen");
        let s1 = GpuSample { pcie_replays: Some(40), nvlink_errors: Some(2), ..s0.clone() };
        g.sample = s1.clone();
        follow_rises(&mut g, Some(&s0), 10_000);
        let s2 = GpuSample { pcie_replays: Some(52), ..s1.clone() };
        g.sample = s2.clone();
        follow_rises(&mut g, Some(&s1), 20_000);
        assert_eq!(
            slow_signals(&report(g.clone()), None),
            vec!["GPU 0 (GPU-a) PCIe replays +42, NVLink errors +2".to_string()]
        );
        // Quiet for five minutes: no longer evidence.
        follow_rises(&mut g, Some(&s2), 20_000 + RISE_WINDOW_MS + 1);
        assert!(slow_signals(&report(g.clone()), None).is_empty());
        // A driver reload zeroes the counters: no rise.
        let reloaded = GpuSample {
            pcie_replays: Some(0),
            nvlink_errors: Some(0),
            ecc_volatile_corrected: Some(0),
            ..s2.clone()
        };
        g.sample = reloaded;
        follow_rises(&mut g, Some(&s2), 20_000 + RISE_WINDOW_MS + 2);
        assert!(g.rises.is_empty());
    }

    #[test]
    fn throttle_reasons_a_low_clock_under_load_and_recent_xids_slow_a_gpu() {
        let busy_low = GpuSample {
            throttle_reasons: vec!["hw-slowdown", "sw-power-cap"],
            sm_clock_mhz: Some(1_110),
            sm_clock_max_mhz: Some(1_980),
            utilization: Some(0.97),
            ..GpuSample::default()
        };
        let mut g = gpu(busy_low.clone());
        g.recent_xids = vec![(13, 5), (13, 9), (31, 7)];
        assert_eq!(
            slow_signals(&report(g), None),
            vec!["GPU 0 (GPU-a) hw-slowdown, SM clock 1110 of 1980 MHz, XID 13, XID 31".to_string()]
        );
        // Idle and clocked down, at its power cap: nothing slows a job.
        let idle = GpuSample {
            throttle_reasons: vec!["sw-power-cap", "gpu-idle"],
            utilization: Some(0.1),
            ..busy_low
        };
        assert!(slow_signals(&report(gpu(idle)), None).is_empty());
        // Another GPU than the worker's: not its evidence.
        let hot = GpuSample { throttle_reasons: vec!["hw-thermal"], ..GpuSample::default() };
        let ids = vec!["1".to_string()];
        assert!(slow_signals(&report(gpu(hot)), Some(&ids)).is_empty());
    }

    /// Only what no workload causes is a machine's slowdown: a kernel's bad access (XID 13, 31:
    /// the application's), thermals and a low clock under load slow a job, yet may be its own.
    #[test]
    fn a_machine_s_slowdown_is_one_no_workload_causes() {
        let none = XidOverrides::new();
        let machine = |g: GpuStatus| machine_slow(&report(g), None, &none);
        let thermal = GpuSample {
            throttle_reasons: vec!["hw-thermal", "sw-thermal"],
            sm_clock_mhz: Some(900),
            sm_clock_max_mhz: Some(1_980),
            utilization: Some(1.0),
            ..GpuSample::default()
        };
        let mut app = gpu(thermal.clone());
        app.recent_xids = vec![(13, 5), (31, 7), (43, 8)];
        assert!(!slow_signals(&report(app.clone()), None).is_empty(), "evidence all the same");
        assert!(!machine(app.clone()));
        let braked = GpuSample { throttle_reasons: vec!["hw-power-brake"], ..thermal.clone() };
        assert!(machine(gpu(braked)));
        // HW Slowdown: raised by a power draw or a temperature too high too (a job's doing).
        let slowed = GpuSample { throttle_reasons: vec!["hw-slowdown"], ..thermal.clone() };
        assert!(!machine(gpu(slowed)));
        let mut fallen = app.clone();
        fallen.recent_xids.push((79, 9));
        assert!(machine(fallen), "XID 79: the GPU fell off the bus");
        let mut retrying = app;
        retrying.rises = vec![Rise { what: "PCIe replays", by: 40, at_ms: 1 }];
        assert!(machine(retrying));
    }
}
