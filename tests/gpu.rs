//! GPU health end to end below the agent: the real monitor thread (`spawn_monitor`) and the pure
//! policy, driven through `GpuProbe` by a scriptable fake NVML; and the real `NvmlProbe` / `start`
//! on a machine without a driver (the "no NVIDIA driver" path must say so and not crash).

use crate::common::fake_gpu;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fake_gpu::FakeGpu;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use vigil::accel::clock_ms;
use vigil::accel::gpu::model::{GpuHealth, GpuMonitorState, GpuReport};
use vigil::accel::gpu::model::{RecoveryAction, RemappedRows};
use vigil::accel::gpu::monitor::spawn_monitor;
use vigil::accel::gpu::nvml::{GpuError, NvmlProbe};
use vigil::accel::gpu::policy::{evidence, worker_on_failed_gpu};
use vigil::accel::gpu::start::start;
use vigil::config::{GpuConfig, Switch};

/// A guard against a hung test, not a speed assertion: conditions are normally met in
/// milliseconds.
const LIMIT: Duration = Duration::from_secs(10);
const UUID0: &str = "GPU-00000000-1111-2222-3333-444444444444";
const UUID1: &str = "GPU-11111111-1111-2222-3333-444444444444";

fn cfg() -> GpuConfig {
    GpuConfig {
        enabled: Switch::On,
        sample_interval: Duration::from_millis(20),
        ..GpuConfig::default()
    }
}

/// The monitor thread over a fake with two healthy GPUs; stopped and joined on drop.
struct Monitor {
    fake: FakeGpu,
    rx: watch::Receiver<GpuReport>,
    stop: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    fn start() -> Monitor {
        Monitor::start_with(cfg())
    }

    fn start_with(cfg: GpuConfig) -> Monitor {
        let fake = FakeGpu::new();
        fake.add_gpu(0, UUID0);
        fake.add_gpu(1, UUID1);
        let (tx, rx) = watch::channel(GpuReport::default());
        let stop = CancellationToken::new();
        let thread =
            spawn_monitor(Box::new(fake.clone()), cfg, tx, stop.clone()).expect("a monitor thread");
        let m = Monitor { fake, rx, stop, thread: Some(thread) };
        m.wait_for("both GPUs healthy", |r| {
            r.monitoring() && r.gpus.len() == 2 && r.node == GpuHealth::Healthy
        });
        m
    }

    /// The first published report that satisfies `pred`.
    fn wait_for(&self, what: &str, pred: impl Fn(&GpuReport) -> bool) -> GpuReport {
        let deadline = Instant::now() + LIMIT;
        loop {
            let r = self.rx.borrow().clone();
            if pred(&r) {
                return r;
            }
            assert!(Instant::now() < deadline, "never saw: {what}; last report: {r:#?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn now(&self) -> GpuReport {
        self.rx.borrow().clone()
    }

    /// Inject one XID on GPU `index`; the first report that counts it.
    fn inject_xid_and_wait(&self, index: u32, xid: u64) -> GpuReport {
        self.fake.inject_xid(index, xid);
        let id = index.to_string();
        self.wait_for(&format!("XID {xid} counted"), |r| {
            r.gpu(&id).is_some_and(|g| g.xid_counts.get(&xid) == Some(&1))
        })
    }

    /// The first published report in which GPU `id` is `h`.
    fn wait_health(&self, what: &str, id: &str, h: GpuHealth) -> GpuReport {
        self.wait_for(what, |r| health(r, id) == Some(h))
    }

    fn stop(mut self) {
        if let Some(joined) = self.halt() {
            joined.expect("the monitor thread panicked");
        }
    }

    /// Tell the thread to stop and join it (once).
    fn halt(&mut self) -> Option<std::thread::Result<()>> {
        self.stop.cancel();
        self.thread.take().map(JoinHandle::join)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

fn health(r: &GpuReport, id: &str) -> Option<GpuHealth> {
    r.gpu(id).map(|g| g.health)
}

/// Whether one of the node's reasons mentions `needle`.
fn has_reason(r: &GpuReport, needle: &str) -> bool {
    r.node_reasons.iter().any(|s| s.contains(needle))
}

#[test]
fn hardware_xid_fails_the_gpu_and_the_node_for_good() {
    let m = Monitor::start();
    m.fake.inject_xid(0, 79);
    let r = m.wait_health("GPU 0 failed", "0", GpuHealth::Failed);
    assert_eq!(r.node, GpuHealth::Failed);
    assert_eq!(health(&r, "1"), Some(GpuHealth::Healthy));
    assert_eq!(r.gpu("0").unwrap().xid_counts.get(&79), Some(&1));
    assert!(
        r.node_reasons.iter().any(|s| s.contains("XID 79 (GPU has fallen off the bus)")
            && s.contains(UUID0)
            && s.contains("reboot the node")),
        "{:?}",
        r.node_reasons
    );
    assert!(worker_on_failed_gpu(&r, Some(&["0".to_string()])));
    assert!(worker_on_failed_gpu(&r, None));
    assert!(!worker_on_failed_gpu(&r, Some(&[UUID1.to_string()])));

    // The next samples look perfectly normal; the verdict stays.
    m.fake.wait_samples(3, LIMIT);
    let r = m.now();
    assert_eq!(health(&r, "0"), Some(GpuHealth::Failed));
    assert_eq!(r.node, GpuHealth::Failed);
    m.stop();
}

#[test]
fn application_xid_is_recorded_and_the_gpu_stays_healthy() {
    let m = Monitor::start();
    let r = m.inject_xid_and_wait(1, 13);
    assert_eq!(health(&r, "1"), Some(GpuHealth::Healthy));
    assert_eq!(r.node, GpuHealth::Healthy);
    assert!(r.node_reasons.is_empty(), "{:?}", r.node_reasons);
    assert_eq!(r.gpu("1").unwrap().recent_xids.len(), 1);
    // XID 13 is not evidence by default (only 43 and 109 are).
    assert!(evidence(&r, None, clock_ms(), &cfg()).is_empty());
    m.fake.wait_samples(2, LIMIT);
    assert_eq!(m.now().node, GpuHealth::Healthy);
    m.stop();
}

#[test]
fn evidence_xid_is_recorded_and_attached_to_hang_alerts() {
    let m = Monitor::start();
    let r = m.inject_xid_and_wait(0, 43);
    assert_eq!(r.node, GpuHealth::Healthy, "43 is an application XID");
    let cfg = cfg();
    let lines = evidence(&r, Some(&["0".to_string()]), clock_ms(), &cfg);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with(&format!("XID 43 on GPU 0 ({UUID0}) ")), "{lines:?}");
    assert!(lines[0].ends_with(" ago"), "{lines:?}");
    assert_eq!(evidence(&r, Some(&[UUID0.to_string()]), clock_ms(), &cfg), lines);
    assert_eq!(evidence(&r, None, clock_ms(), &cfg), lines);
    assert!(evidence(&r, Some(&["1".to_string()]), clock_ms(), &cfg).is_empty());
    assert!(!worker_on_failed_gpu(&r, None));
    m.stop();
}

#[test]
fn uncorrectable_ecc_degrades_the_gpu() {
    let m = Monitor::start();
    m.fake.set_ecc_uncorrected(1, 2);
    let r = m.wait_health("GPU 1 degraded", "1", GpuHealth::Degraded);
    assert_eq!(r.node, GpuHealth::Degraded);
    assert!(has_reason(&r, "2 uncorrectable ECC"), "{:?}", r.node_reasons);
    assert!(!worker_on_failed_gpu(&r, None), "degraded is not failed");
    m.fake.set_ecc_uncorrected(1, 0);
    m.wait_for("healthy again after the counters reset", |r| r.node == GpuHealth::Healthy);
    m.stop();
}

#[test]
fn pending_retirement_and_a_pending_remap_degrade_and_a_remap_failure_fails() {
    let m = Monitor::start();
    m.fake.set_pending_retirement(0, true);
    let r = m.wait_health("GPU 0 degraded", "0", GpuHealth::Degraded);
    assert!(has_reason(&r, "pending retirement"), "{:?}", r.node_reasons);
    m.fake.set_pending_retirement(0, false);
    m.wait_for("healthy again", |r| r.node == GpuHealth::Healthy);

    m.fake.set_remap(
        1,
        RemappedRows { correctable: 1, uncorrectable: 3, pending: false, failure: true },
    );
    let r = m.wait_health("GPU 1 failed", "1", GpuHealth::Failed);
    assert!(has_reason(&r, "row remapping failed"), "{:?}", r.node_reasons);
    assert_eq!(r.gpu("1").unwrap().sample.remapped_rows.map(|x| x.uncorrectable), Some(3));
    m.fake.set_remap(1, RemappedRows { pending: true, ..RemappedRows::default() });
    let r = m.wait_for("remap pending", |r| has_reason(r, "row remap is pending"));
    assert_eq!(r.node, GpuHealth::Degraded, "survivable until the next reset");
    assert!(has_reason(&r, "reset it at the next convenient time"));
    assert!(!worker_on_failed_gpu(&r, None));
    m.stop();
}

#[test]
fn removed_gpu_is_failed_and_missing() {
    let m = Monitor::start();
    m.fake.remove_gpu(1);
    let r = m.wait_for("GPU 1 missing", |r| r.gpu("1").is_some_and(|g| g.missing));
    let g = r.gpu("1").unwrap();
    assert_eq!(g.health, GpuHealth::Failed);
    assert_eq!(g.uuid, UUID1);
    assert_eq!(
        g.reasons,
        vec![format!(
            "GPU 1 ({UUID1}): no longer visible to NVML (fell off the bus?); reboot the node"
        )]
    );
    assert_eq!(r.node, GpuHealth::Failed);
    assert_eq!(health(&r, "0"), Some(GpuHealth::Healthy));
    assert!(worker_on_failed_gpu(&r, Some(&["1".to_string()])));
    m.stop();
}

#[test]
fn every_sample_reaches_the_report() {
    let m = Monitor::start();
    m.fake.set_temperature(0, 87);
    let r = m.wait_for("new temperature", |r| {
        r.gpu("0").and_then(|g| g.sample.temperature_c) == Some(87)
    });
    let s = &r.gpu("0").unwrap().sample;
    assert_eq!(s.uuid, UUID0);
    assert_eq!(s.memory_total_bytes, Some(80 << 30));
    assert_eq!(r.node, GpuHealth::Healthy, "heat alone is not a verdict");
    m.stop();
}

#[test]
fn failed_reads_keep_the_last_verdict_and_xids_still_arrive() {
    let m = Monitor::start();
    m.fake.fail_samples(true);
    m.fake.wait_samples(2, LIMIT);
    let r = m.now();
    assert_eq!(r.gpus.len(), 2);
    assert!(r.gpus.iter().all(|g| !g.missing), "a failed read is not 'every GPU is gone'");
    assert_eq!(r.node, GpuHealth::Healthy);
    m.fake.inject_xid(1, 95);
    let r = m.wait_health("XID folded in while reads fail", "1", GpuHealth::Failed);
    assert!(r.gpus.iter().all(|g| !g.missing));
    m.fake.fail_samples(false);
    m.fake.wait_samples(1, LIMIT);
    assert_eq!(m.wait_for("reads again", |r| r.node == GpuHealth::Failed).gpus.len(), 2);
    m.stop();
}

#[test]
fn a_wedged_driver_is_reported_once_as_unknown_and_the_verdict_returns_when_it_answers() {
    let m = Monitor::start_with(GpuConfig { call_deadline: Duration::from_secs(2), ..cfg() });
    m.fake.inject_xid(1, 95);
    m.wait_health("GPU 1 failed", "1", GpuHealth::Failed);
    let before = m.fake.samples_taken();
    m.fake.wedge(true);
    let r = m.wait_for("the wedged call reported", |r| r.state == GpuMonitorState::NvmlHung);
    assert!(!r.monitoring(), "no verdict while NVML does not answer");
    assert_eq!(r.hung.as_deref(), Some("reading the GPUs has not returned within 2s"));
    assert_eq!(
        health(&r, "1"),
        Some(GpuHealth::Failed),
        "a failed GPU stays failed (its worker's restarts stay blocked)"
    );
    assert!(worker_on_failed_gpu(&r, Some(&["1".to_string()])));
    // The receiver is never blocked: the report is there to read while the call hangs.
    assert_eq!(m.fake.samples_taken(), before, "the read is still stuck");
    m.fake.wedge(false);
    let r = m.wait_for("the verdict back", |r| r.monitoring());
    assert_eq!(r.hung, None);
    assert_eq!(health(&r, "1"), Some(GpuHealth::Failed));
    assert_eq!(health(&r, "0"), Some(GpuHealth::Healthy));
    m.stop();
}

#[test]
fn a_storm_of_one_xid_is_one_episode() {
    let m = Monitor::start();
    m.fake.inject_xids(0, 13, 5000);
    let r = m.wait_for("every event counted", |r| {
        r.gpu("0").is_some_and(|g| g.xid_counts.get(&13) == Some(&5000))
    });
    assert_eq!(r.begun.len(), 1, "{:?}", r.begun);
    assert_eq!(
        r.begun[0].detail,
        format!("XID 13 (graphics engine exception) on GPU 0 ({UUID0}): restart the application")
    );
    assert_eq!(r.gpu("0").unwrap().episodes[0].count, 5000);
    m.fake.inject_xids(0, 13, 10);
    let r = m.wait_for("more of the same", |r| {
        r.gpu("0").is_some_and(|g| g.xid_counts.get(&13) == Some(&5010))
    });
    assert_eq!(r.begun.len(), 1, "still the same episode");
    m.stop();
}

/// XID batches through the monitor loop (`follow`), between samples an hour apart: each batch
/// is folded in and published as it arrives, no batch counts a GPU absent from the last sample
/// again, and XID 154 (the driver changed its recovery action) brings the next sample forward.
#[test]
fn xid_batches_between_samples_fold_in_at_once_and_154_brings_the_sample_forward() {
    let m = Monitor::start_with(GpuConfig { sample_interval: Duration::from_secs(3600), ..cfg() });
    let sampled = m.fake.samples_taken();
    // GPU 1 falls off the bus after the first sample; the driver now asks for a reset of GPU 0.
    m.fake.remove_gpu(1);
    m.fake.set_recovery_action(0, RecoveryAction::GpuReset);
    for n in 1..=5 {
        m.fake.inject_xids(0, 13, 2);
        let r = m.wait_for("the batch counted", |r| {
            r.gpu("0").is_some_and(|g| g.xid_counts.get(&13) == Some(&(2 * n)))
        });
        let gone = r.gpu("1").expect("GPU 1 as last sampled");
        assert!(!gone.missing && gone.missing_rounds == 0, "batch {n}: {gone:#?}");
        assert_eq!(r.node, GpuHealth::Healthy, "batch {n}: {:?}", r.node_reasons);
    }
    assert_eq!(m.fake.samples_taken(), sampled, "no batch reads the GPUs");
    m.fake.inject_xid(0, 154);
    let r = m.wait_health("GPU 0 failed at the next sample", "0", GpuHealth::Failed);
    assert!(has_reason(&r, "the driver asks for NVML_GPU_RECOVERY_ACTION_GPU_RESET"), "{r:#?}");
    let gone = r.gpu("1").expect("GPU 1 as last sampled");
    assert_eq!((gone.missing, gone.missing_rounds), (false, 1), "one sample without it");
    m.stop();
}

#[test]
fn stop_ends_the_monitor_thread() {
    let m = Monitor::start();
    m.stop(); // joins; a monitor that ignored `stop` would hang here
}

#[test]
fn nvml_probe_without_a_library_is_no_library() {
    let err = NvmlProbe::new(Some("/nonexistent/vigil/libnvidia-ml.so.1")).unwrap_err();
    assert!(matches!(err, GpuError::NoLibrary(_)), "{err:?}");
    assert!(err.to_string().contains("no NVIDIA driver"), "{err}");
}

#[test]
fn nvml_probe_on_this_machine() {
    match NvmlProbe::new(None) {
        Err(GpuError::NoLibrary(_)) => {}
        // A machine with a driver: the real probe must read every GPU it lists.
        Ok(mut probe) => {
            use vigil::accel::gpu::nvml::GpuProbe;
            let n = probe.gpu_count().expect("device count");
            let samples = probe.sample().expect("sample");
            assert_eq!(samples.len() as u32, n, "{samples:#?}");
            assert!(samples.iter().all(|s| s.uuid.starts_with("GPU-")), "{samples:#?}");
            let xids = probe.wait_xids(Duration::from_millis(50)).expect("wait for XIDs");
            assert!(xids.is_empty(), "unexpected XIDs on this machine: {xids:?}");
        }
        Err(e) => {
            assert!(
                std::path::Path::new("/dev/nvidiactl").exists(),
                "no NVIDIA device here, so NVML must be NoLibrary, not {e:?}"
            );
        }
    }
}

#[tokio::test]
async fn start_off_does_nothing() {
    let cfg = GpuConfig { enabled: Switch::Off, ..cfg() };
    let (tx, rx) = watch::channel(GpuReport::default());
    assert!(start(&cfg, tx, CancellationToken::new(), None, None).await.is_none());
    assert!(!rx.borrow().monitoring());
    assert_eq!(rx.borrow().state, GpuMonitorState::Off);
}
