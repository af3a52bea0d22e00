//! Table-driven tests of the TPU rules, with a fixed `now`: in a file of their own so the rules
//! in tpu.rs read in one screenful.

use super::*;
use crate::accel::policy::{desired, event_for};
use crate::accel::tpu::model::TpuHealth;
use crate::config::KubernetesConfig;
use crate::vocab::node::{ConditionStatus, EventType, NodeDesired};

const NOW: i64 = 10_000_000;
const WINDOW: Duration = Duration::from_secs(600);

fn chips() -> TpuChips {
    TpuChips {
        pci: vec!["0000:00:04.0".into(), "0000:00:05.0".into()],
        accel: vec!["accel0".into(), "accel1".into()],
    }
}

fn rec(level: u8, text: &str, subsystem: Option<&str>, device: Option<&str>) -> KernelRecord {
    KernelRecord {
        level,
        ts_us: 1,
        text: text.into(),
        subsystem: subsystem.map(str::to_string),
        device: device.map(str::to_string),
    }
}

#[test]
fn classify_table() {
    use ErrorSeverity::{Error as E, Fatal as F};
    type Row<'a> =
        (u8, &'a str, Option<&'a str>, Option<&'a str>, Option<(&'a str, ErrorSeverity)>);
    #[rustfmt::skip]
    let table: &[Row] = &[
        // A TPU function's own AER line, new and old wording.
        (3, "vfio-pci 0000:00:04.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Inaccessible, (Unregistered Agent ID)",
            Some("pci"), Some("+pci:0000:00:04.0"), Some(("0000:00:04.0", F))),
        (3, "vfio-pci 0000:00:05.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
            Some("pci"), Some("+pci:0000:00:05.0"), Some(("0000:00:05.0", F))),
        (3, "vfio-pci 0000:00:04.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, (Requester ID)",
            Some("pci"), Some("+pci:0000:00:04.0"), Some(("0000:00:04.0", E))),
        // Correctable errors are warnings: not a device error.
        (4, "vfio-pci 0000:00:04.0: AER: PCIe Bus Error: severity=Correctable, type=Physical Layer, (Receiver ID)",
            Some("pci"), Some("+pci:0000:00:04.0"), None),
        // The root port's line names the TPU function that sent the error.
        (3, "pcieport 0000:00:03.0: AER: Uncorrectable (Fatal) error message received from 0000:00:05.0",
            Some("pci"), Some("+pci:0000:00:03.0"), Some(("0000:00:05.0", F))),
        // Google's accel class (TPU v4): by the dictionary, or by the dev_printk prefix.
        (3, "accel accel1: tpu_common_reinit_reset: Device did not come back from reset.",
            Some("accel"), Some("c121:1"), Some(("accel1", E))),
        (3, "accel accel0: tpu_common_device_open: Failed to reset device", None, None, Some(("accel0", E))),
        // Informational messages about a chip are not errors.
        (6, "vfio-pci 0000:00:04.0: enabling device (0000 -> 0002)", Some("pci"), Some("+pci:0000:00:04.0"), None),
        // Other devices: not ours, whatever the level.
        (3, "nvme 0000:00:06.0: I/O 12 QID 3 timeout", Some("pci"), Some("+pci:0000:00:06.0"), None),
        (3, "accel accel7: something", Some("accel"), Some("c121:7"), None),
        (3, "accel accel0: from another major", Some("accel"), Some("c261:0"), Some(("accel0", E))),
        (0, "Kernel panic - not syncing", None, None, None),
        // An address that only starts like a chip's is not the chip.
        (3, "something 0000:00:04.01 failed", None, None, None),
        (3, "dma error at 0000:00:04.0, resetting", None, None, Some(("0000:00:04.0", E))),
    ];
    for (i, (level, text, sub, dev, want)) in table.iter().enumerate() {
        let got = classify(&rec(*level, text, *sub, *dev), &chips());
        let want = want.map(|(d, s)| (d.to_string(), s));
        assert_eq!(got, want, "row {i}: {text}");
    }
}

fn obs(files: &[&str], expected: Option<u32>, errors: Vec<DeviceError>) -> TpuMemory {
    let device_files = files.iter().map(|f| f.to_string()).collect();
    TpuMemory { device_files, expected, errors, ..TpuMemory::default() }
}

fn err(age_ms: i64, severity: ErrorSeverity, device: &str) -> DeviceError {
    DeviceError {
        at_ms: NOW - age_ms,
        severity,
        device: device.into(),
        source: "kernel-log",
        message: format!("{} on {device}", severity.as_str()),
    }
}

#[test]
fn verdict_table() {
    use crate::accel::model::Health::{Degraded as D, Failed as X, Healthy as H};
    use ErrorSeverity::{Error as E, Fatal as F};
    let four = ["vfio/0", "vfio/1", "vfio/2", "vfio/3"];
    let min = 60_000;
    // files, expected, errors → monitoring, health, number of reasons, (errors, fatal)
    type Row<'a> =
        (&'a [&'a str], Option<u32>, Vec<DeviceError>, bool, TpuHealth, usize, (u32, u32));
    #[rustfmt::skip]
    let table: Vec<Row> = vec![
        // Not a TPU node.
        (&[], None, vec![], false, H, 0, (0, 0)),
        (&[], Some(0), vec![err(0, F, "x")], false, H, 0, (0, 0)),
        // All there.
        (&four, Some(4), vec![], true, H, 0, (0, 0)),
        (&["accel0", "accel1", "accel2", "accel3"], Some(4), vec![], true, H, 0, (0, 0)),
        // Allocatable not known yet: the files alone say nothing is wrong.
        (&four, None, vec![], true, H, 0, (0, 0)),
        // A chip is gone.
        (&four[..3], Some(4), vec![], true, X, 1, (0, 0)),
        (&[], Some(4), vec![], true, X, 1, (0, 0)),
        // More chips than advertised: the device plugin holds some back.
        (&four, Some(3), vec![], true, D, 1, (0, 0)),
        (&four, Some(0), vec![], true, D, 1, (0, 0)),
        // Errors within the window.
        (&four, Some(4), vec![err(min, E, "0000:00:04.0")], true, D, 1, (1, 0)),
        (&four, Some(4), vec![err(min, F, "0000:00:04.0")], true, X, 1, (0, 1)),
        (&four, Some(4), vec![err(min, E, "a"), err(2 * min, E, "a"), err(min, E, "b")], true, D, 2, (3, 0)),
        (&four, Some(4), vec![err(min, E, "a"), err(min, F, "a")], true, X, 2, (1, 1)),
        // Errors older than the window no longer count; one exactly at its edge neither.
        (&four, Some(4), vec![err(10 * min, F, "a"), err(11 * min, E, "a")], true, H, 0, (0, 0)),
        (&four, Some(4), vec![err(10 * min - 1, F, "a")], true, X, 1, (0, 1)),
        // A missing chip and an error: both said, the worst wins.
        (&four[..2], Some(4), vec![err(0, E, "a")], true, X, 2, (1, 0)),
    ];
    for (i, (files, expected, errors, monitoring, health, reasons, recent)) in
        table.into_iter().enumerate()
    {
        let r = verdict(&obs(files, expected, errors), NOW, WINDOW);
        assert_eq!(r.monitoring, monitoring, "row {i}");
        assert_eq!(r.health, health, "row {i}: {:?}", r.reasons);
        assert_eq!(r.reasons.len(), reasons, "row {i}: {:?}", r.reasons);
        assert_eq!(r.recent_errors, recent, "row {i}");
        assert_eq!(r.expected, expected, "row {i}");
        if monitoring {
            assert_eq!(r.present as usize, files.len(), "row {i}");
        }
    }
}

#[test]
fn reasons_say_what_is_missing_and_which_error() {
    let r = verdict(&obs(&["accel0", "accel2"], Some(4), vec![]), NOW, WINDOW);
    assert_eq!(r.reasons, ["2 of 4 TPU chips have a device file (found: accel0, accel2)"]);
    let mut last = err(1_000, ErrorSeverity::Fatal, "0000:00:04.0");
    last.message = "severity=Uncorrectable (Fatal)".into();
    let errors = vec![err(5_000, ErrorSeverity::Fatal, "0000:00:04.0"), last];
    let r = verdict(&obs(&["vfio/0"], Some(1), errors), NOW, WINDOW);
    assert_eq!(
        r.reasons,
        ["2 fatal device error(s) on 0000:00:04.0 within 10m (last, kernel-log: severity=Uncorrectable (Fatal))"]
    );
    assert!(r.summary().starts_with(
        "TPU health failed: 1 chip(s) present, allocatable google.com/tpu 1; 2 fatal"
    ));
}

/// The reasons carry no time: the same facts a minute later are the same report, so the Node is
/// not rewritten on every poll.
#[test]
fn the_same_facts_later_are_the_same_report() {
    let errors = vec![err(0, ErrorSeverity::Error, "a")];
    let o = obs(&["vfio/0"], Some(1), errors);
    assert_eq!(verdict(&o, NOW, WINDOW), verdict(&o, NOW + 60_000, WINDOW));
}

#[test]
fn aer_counters_rising_are_errors_and_the_first_reading_is_a_baseline() {
    let c = |fatal, nonfatal| AerCounts { fatal, nonfatal };
    let a = "0000:00:04.0".to_string();
    let b = "0000:00:05.0".to_string();
    let first = BTreeMap::from([(a.clone(), c(2, 5))]);
    assert!(aer_errors(&BTreeMap::new(), &first, NOW).is_empty());
    let next = BTreeMap::from([(a.clone(), c(3, 7)), (b.clone(), c(9, 9))]);
    let errors = aer_errors(&first, &next, NOW);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(errors[0].severity, ErrorSeverity::Fatal);
    assert_eq!(errors[0].message, "1 uncorrectable fatal PCIe error(s) (AER)");
    assert_eq!(errors[1].severity, ErrorSeverity::Error);
    assert_eq!(errors[1].message, "2 uncorrectable non-fatal PCIe error(s) (AER)");
    assert!(errors.iter().all(|e| e.device == a && e.source == "aer"));
    // Reset counters (the device was probed again): a new baseline, not an error.
    let reset = BTreeMap::from([(a, c(0, 0))]);
    assert!(aer_errors(&next, &reset, NOW).is_empty());
}

#[test]
fn prune_keeps_the_window_and_the_newest() {
    let mut errors = vec![
        err(WINDOW.as_millis() as i64, ErrorSeverity::Error, "old"),
        err(0, ErrorSeverity::Error, "new"),
    ];
    prune(&mut errors, NOW, WINDOW);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].device, "new");
    let mut storm: Vec<DeviceError> = (0..MAX_ERRORS as i64 + 10)
        .map(|i| err(MAX_ERRORS as i64 + 10 - i, ErrorSeverity::Error, &i.to_string()))
        .collect();
    prune(&mut storm, NOW, WINDOW);
    assert_eq!(storm.len(), MAX_ERRORS);
    assert_eq!(storm.last().unwrap().device, (MAX_ERRORS + 9).to_string());
}

#[test]
fn allocatable_is_a_whole_number() {
    assert_eq!(allocatable_chips("4"), Some(4));
    assert_eq!(allocatable_chips(" 8 "), Some(8));
    assert_eq!(allocatable_chips("0"), Some(0));
    assert_eq!(allocatable_chips("4k"), None);
    assert_eq!(allocatable_chips("-1"), None);
    assert_eq!(allocatable_chips(""), None);
}

#[test]
fn node_fields_follow_the_report() {
    let k = KubernetesConfig::default();
    let failed = TpuReport {
        monitoring: true,
        present: 3,
        expected: Some(4),
        health: TpuHealth::Failed,
        reasons: vec!["3 of 4".into()],
        ..TpuReport::default()
    };
    let mut d = NodeDesired::default();
    desired(&k, &failed, true, &mut d);
    assert_eq!(d.labels["vigil.dev/tpu-health"].as_deref(), Some("failed"));
    assert_eq!(d.annotations["vigil.dev/tpu-health-reasons"].as_deref(), Some("3 of 4"));
    assert_eq!(d.add_taints.len(), 1);
    assert_eq!(d.add_taints[0].key, "vigil.dev/tpu-failed");
    let c = &d.conditions[0];
    assert_eq!(
        (c.kind.as_str(), c.status, c.reason.as_str()),
        ("VigilTPUUnhealthy", ConditionStatus::True, "Failed")
    );
    assert!(d.remove_conditions.is_empty());

    // Without the taint option, and for the other healths: no taint, condition False.
    for (health, reason) in [
        (TpuHealth::Failed, "Failed"),
        (TpuHealth::Degraded, "Degraded"),
        (TpuHealth::Healthy, "Healthy"),
    ] {
        let r = TpuReport { health, ..failed.clone() };
        let mut d = NodeDesired::default();
        desired(&k, &r, false, &mut d);
        assert!(d.add_taints.is_empty());
        assert_eq!(d.remove_taints, ["vigil.dev/tpu-failed"]);
        let want = if health == TpuHealth::Failed {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        assert_eq!(d.conditions[0].status, want, "{health:?}");
        assert_eq!(d.conditions[0].reason, reason);
    }

    // No verdict: label, annotation and condition come off.
    let mut d = NodeDesired::default();
    desired(&k, &TpuReport::default(), true, &mut d);
    assert_eq!(d.labels["vigil.dev/tpu-health"], None);
    assert_eq!(d.annotations["vigil.dev/tpu-health-reasons"], None);
    assert!(d.conditions.is_empty() && d.add_taints.is_empty());
    assert_eq!(d.remove_conditions, ["VigilTPUUnhealthy"]);
}

#[test]
fn events_by_health() {
    assert_eq!(event_for(&TPU, TpuHealth::Failed), ("VigilTpuFailed", EventType::Warning));
    assert_eq!(event_for(&TPU, TpuHealth::Degraded), ("VigilTpuDegraded", EventType::Warning));
    assert_eq!(event_for(&TPU, TpuHealth::Healthy), ("VigilTpuHealthy", EventType::Normal));
}

/// A reading's kernel records and AER counters become dated device errors; the verdict follows
/// them in and, `window` later, out again.
#[test]
fn fold_dates_errors_and_lets_them_age_out() {
    let mut mem = TpuMemory::default();
    let files: Vec<String> = ["vfio/0", "vfio/1"].map(String::from).to_vec();
    let pci =
        |fatal| BTreeMap::from([("0000:00:04.0".to_string(), AerCounts { fatal, nonfatal: 0 })]);
    let reading =
        |aer, records| TpuReading { device_files: files.clone(), chips: chips(), aer, records };
    // A baseline of 3 fatal errors since boot, and a backlog record 20 minutes old: neither
    // counts.
    let old = rec(3, "vfio-pci 0000:00:05.0: reset failed", None, None);
    let r = fold(&mut mem, &reading(pci(3), vec![(old, Some(20 * 60_000))]), Some(2), NOW, WINDOW);
    assert_eq!((r.health, r.errors_total), (TpuHealth::Healthy, (0, 0)));
    // One error record 1 minute old, one just arrived, and the fatal counter rising.
    let a = rec(3, "vfio-pci 0000:00:05.0: reset failed", None, None);
    let b = rec(6, "vfio-pci 0000:00:05.0: enabled", None, None);
    let r =
        fold(&mut mem, &reading(pci(4), vec![(a, Some(60_000)), (b, None)]), Some(2), NOW, WINDOW);
    assert_eq!(r.health, TpuHealth::Failed, "{:?}", r.reasons);
    assert_eq!((r.recent_errors, r.errors_total), ((1, 1), (1, 1)));
    assert_eq!(mem.errors[0].at_ms, NOW - 60_000, "dated by its age");
    // Ten minutes on, nothing new: the AER error (at NOW) is still in, the older one out.
    let later = NOW + WINDOW.as_millis() as i64 - 1;
    let r = fold(&mut mem, &reading(pci(4), vec![]), Some(2), later, WINDOW);
    assert_eq!((r.health, r.recent_errors), (TpuHealth::Failed, (0, 1)));
    let r = fold(&mut mem, &reading(pci(4), vec![]), Some(2), later + 1, WINDOW);
    assert_eq!((r.health, r.recent_errors, r.errors_total), (TpuHealth::Healthy, (0, 0), (1, 1)));
}

/// One polarity for every Vigil condition: `True` is the problem, `False` the absence of it.
#[test]
fn every_condition_is_true_for_a_problem() {
    use crate::accel::gpu::model::{GpuHealth, GpuReport};
    use crate::accel::gpu::policy_node::gpu_condition;
    use crate::maintenance::policy::maintenance_condition;
    use crate::vocab::maintenance::{MaintenanceState, Phase};
    use crate::vocab::node::{CONDITIONS, GPU_CONDITION, MAINTENANCE_CONDITION};
    let gpu = |monitoring: bool, node| {
        gpu_condition(&GpuReport {
            state: if monitoring {
                crate::accel::gpu::model::GpuMonitorState::On
            } else {
                crate::accel::gpu::model::GpuMonitorState::Off
            },
            node,
            ..GpuReport::default()
        })
    };
    let tpu = |health| {
        TpuReport { monitoring: true, health, ..TpuReport::default() }
            .condition()
            .expect("a TPU node has the condition")
    };
    let maint =
        |phase| maintenance_condition(&MaintenanceState { phase, ..MaintenanceState::default() });
    use ConditionStatus::{False, True, Unknown};
    let table = [
        (gpu(true, GpuHealth::Failed), GPU_CONDITION, True),
        (gpu(true, GpuHealth::Degraded), GPU_CONDITION, False),
        (gpu(true, GpuHealth::Healthy), GPU_CONDITION, False),
        (gpu(false, GpuHealth::Healthy), GPU_CONDITION, Unknown),
        (tpu(TpuHealth::Failed), TPU_CONDITION, True),
        (tpu(TpuHealth::Degraded), TPU_CONDITION, False),
        (tpu(TpuHealth::Healthy), TPU_CONDITION, False),
        (maint(Phase::Terminating), MAINTENANCE_CONDITION, True),
        (maint(Phase::Pending), MAINTENANCE_CONDITION, True),
        (maint(Phase::None), MAINTENANCE_CONDITION, False),
    ];
    for (i, (c, kind, status)) in table.iter().enumerate() {
        assert_eq!((c.kind.as_str(), c.status), (*kind, *status), "row {i}");
    }
    assert_eq!(GPU_CONDITION, "VigilGPUUnhealthy");
    assert_eq!(TPU_CONDITION, "VigilTPUUnhealthy");
    // `vigil cleanup` takes every type off.
    for kind in [MAINTENANCE_CONDITION, GPU_CONDITION, TPU_CONDITION] {
        assert!(CONDITIONS.contains(&kind), "{kind}");
    }
}
