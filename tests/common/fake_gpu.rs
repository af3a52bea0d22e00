#![allow(dead_code)]
//! A faithful fake of NVML behind `GpuProbe`: the test scripts GPUs and events while the real
//! monitor thread (`vigil::accel::gpu::monitor::spawn_monitor`) and the pure policy run against it.
//!
//! Behaves like `NvmlProbe`: `sample` lists every present GPU (a removed one is simply absent, as a
//! GPU that fell off the bus is); `wait_xids` blocks until an event is injected or the timeout ends,
//! and returns an empty vector on timeout.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vigil::accel::gpu::model::{GpuSample, RecoveryAction, RemappedRows, XidEvent};
use vigil::accel::gpu::nvml::{GpuError, GpuProbe};

#[derive(Default)]
struct State {
    gpus: BTreeMap<u32, GpuSample>,
    xids: VecDeque<XidEvent>,
    samples_taken: u64,
    /// Make the next reads fail, as NVML does when the driver is wedged.
    fail_samples: bool,
    /// Make reads block until released, as an NVML call on a wedged driver never returns.
    wedged: bool,
}

/// Scriptable fake GPUs; clones share the same state.
#[derive(Clone, Default)]
pub struct FakeGpu {
    shared: Arc<(Mutex<State>, Condvar)>,
}

impl FakeGpu {
    pub fn new() -> FakeGpu {
        FakeGpu::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn edit(&self, index: u32, f: impl FnOnce(&mut GpuSample)) {
        let mut st = self.state();
        let gpu =
            st.gpus.get_mut(&index).unwrap_or_else(|| panic!("fake GPU {index} was never added"));
        f(gpu);
    }

    /// A healthy GPU, as an H100 with ECC on reads.
    pub fn add_gpu(&self, index: u32, uuid: &str) {
        self.state().gpus.insert(
            index,
            GpuSample {
                index,
                uuid: uuid.to_string(),
                // As on most machines: /dev/nvidiaN in the index order.
                minor_number: Some(index),
                name: "NVIDIA H100 80GB HBM3 (fake)".into(),
                temperature_c: Some(40),
                power_w: Some(120.5),
                utilization: Some(0.25),
                memory_used_bytes: Some(1 << 30),
                memory_total_bytes: Some(80 << 30),
                ecc_volatile_corrected: Some(0),
                ecc_volatile_uncorrected: Some(0),
                ecc_aggregate_corrected: Some(0),
                ecc_aggregate_uncorrected: Some(0),
                retired_pages: Some(0),
                retired_pages_pending: Some(false),
                remapped_rows: Some(RemappedRows::default()),
                throttle_reasons: vec![],
                compute_processes: Some(0),
                recovery_action: Some(RecoveryAction::None),
                energy_mj: Some(1_000_000),
                persistence_mode: Some(true),
                pcie_replays: Some(0),
                nvlink_errors: Some(0),
                sm_clock_mhz: Some(1_980),
                sm_clock_max_mhz: Some(1_980),
            },
        );
    }

    /// A critical XID event on this GPU (delivered to the waiting monitor at once).
    pub fn inject_xid(&self, index: u32, xid: u64) {
        self.inject_xids(index, xid, 1);
    }

    /// Volatile (and aggregate) uncorrectable ECC errors.
    pub fn set_ecc_uncorrected(&self, index: u32, n: u64) {
        self.edit(index, |g| {
            g.ecc_volatile_uncorrected = Some(n);
            g.ecc_aggregate_uncorrected = Some(n);
        });
    }

    pub fn set_pending_retirement(&self, index: u32, pending: bool) {
        self.edit(index, |g| g.retired_pages_pending = Some(pending));
    }

    pub fn set_remap(&self, index: u32, rows: RemappedRows) {
        self.edit(index, |g| g.remapped_rows = Some(rows));
    }

    /// Processes with a compute context on this GPU (`None`: NVML cannot say).
    pub fn set_compute_processes(&self, index: u32, n: Option<u32>) {
        self.edit(index, |g| g.compute_processes = n);
    }

    /// The driver's recovery action for this GPU (NVML field 230).
    pub fn set_recovery_action(&self, index: u32, a: RecoveryAction) {
        self.edit(index, |g| g.recovery_action = Some(a));
    }

    pub fn set_persistence_mode(&self, index: u32, on: bool) {
        self.edit(index, |g| g.persistence_mode = Some(on));
    }

    /// What a GPU reset (`nvidia-smi -r`) does to what NVML reads: volatile ECC counts and the
    /// energy counter start again, pending remaps and retirements are applied, the driver asks
    /// for no recovery action any more. Aggregate counts and remapped rows stay.
    pub fn reset_gpu(&self, index: u32) {
        self.edit(index, |g| {
            g.ecc_volatile_corrected = Some(0);
            g.ecc_volatile_uncorrected = Some(0);
            g.energy_mj = Some(10);
            g.retired_pages_pending = Some(false);
            if let Some(r) = g.remapped_rows.as_mut() {
                r.pending = false;
            }
            g.recovery_action = Some(RecoveryAction::None);
        });
    }

    /// The link counters since the driver loaded: PCIe replays and NVLink data-link errors
    /// (summed over the links), as NVML reads them.
    pub fn set_link_errors(&self, index: u32, pcie_replays: u64, nvlink_errors: u64) {
        self.edit(index, |g| {
            g.pcie_replays = Some(pcie_replays);
            g.nvlink_errors = Some(nvlink_errors);
        });
    }

    /// The active clock-event (throttle) reasons, as NVML's names read (`hw-slowdown`, …).
    pub fn set_throttle_reasons(&self, index: u32, reasons: Vec<&'static str>) {
        self.edit(index, |g| g.throttle_reasons = reasons);
    }

    /// The SM clock (MHz) and how busy the GPU is (0.0–1.0).
    pub fn set_sm_clock(&self, index: u32, mhz: u32, utilization: f64) {
        self.edit(index, |g| {
            g.sm_clock_mhz = Some(mhz);
            g.utilization = Some(utilization);
        });
    }

    pub fn set_temperature(&self, index: u32, c: u32) {
        self.edit(index, |g| g.temperature_c = Some(c));
    }

    /// The GPU disappears from NVML (fell off the bus).
    pub fn remove_gpu(&self, index: u32) {
        self.state().gpus.remove(&index);
    }

    /// Make reads fail (`true`) or succeed again.
    pub fn fail_samples(&self, fail: bool) {
        self.state().fail_samples = fail;
    }

    /// Reads block (`true`: a wedged driver, whose NVML calls do not return) or are released.
    pub fn wedge(&self, wedged: bool) {
        self.state().wedged = wedged;
        self.shared.1.notify_all();
    }

    /// `n` events of one XID on this GPU at once (a storm), delivered together.
    pub fn inject_xids(&self, index: u32, xid: u64, n: usize) {
        let mut st = self.state();
        let uuid = st.gpus.get(&index).map(|g| g.uuid.clone()).unwrap_or_default();
        for _ in 0..n {
            st.xids.push_back(XidEvent { index, uuid: uuid.clone(), xid });
        }
        drop(st);
        self.shared.1.notify_all();
    }

    /// Successful and failed reads so far.
    pub fn samples_taken(&self) -> u64 {
        self.state().samples_taken
    }

    /// Block until at least `n` more reads happened (the monitor thread is running), or panic
    /// after `limit` (a guard against a hung test, not a speed assertion).
    pub fn wait_samples(&self, n: u64, limit: Duration) {
        let target = self.samples_taken() + n;
        let deadline = Instant::now() + limit;
        while self.samples_taken() < target {
            assert!(Instant::now() < deadline, "the monitor did not read the fake GPUs");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl GpuProbe for FakeGpu {
    fn sample(&mut self) -> Result<Vec<GpuSample>, GpuError> {
        let (lock, cv) = &*self.shared;
        let st = lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = cv.wait_while(st, |st| st.wedged).unwrap_or_else(|p| p.into_inner());
        st.samples_taken += 1;
        if st.fail_samples {
            return Err(GpuError::Call("fake: NVML_ERROR_UNKNOWN".into()));
        }
        Ok(st.gpus.values().cloned().collect())
    }

    fn wait_xids(&mut self, timeout: Duration) -> Result<Vec<XidEvent>, GpuError> {
        let (lock, cv) = &*self.shared;
        let st = lock.lock().unwrap_or_else(|p| p.into_inner());
        let (mut st, _) = cv
            .wait_timeout_while(st, timeout, |st| st.xids.is_empty())
            .unwrap_or_else(|p| p.into_inner());
        Ok(st.xids.drain(..).collect())
    }
}
