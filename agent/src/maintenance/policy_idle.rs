//! Whether a node is idle enough to offer for opportunistic maintenance (pure).
//!
//! Idle means no accelerator in use, by every witness the node has, not only "every opted-in
//! worker says idle": a node with no opted-in worker would otherwise always be idle, and Vigil
//! could ask Compute Engine to take down a VM that runs a training job which never opted in.
//!
//! The witnesses ([`IdleInputs`]):
//! - the opted-in workers' records (the runtime's list and each worker's `state`);
//! - the kubelet's PodResources API: pods given `nvidia.com/*` or `google.com/tpu` devices;
//! - the Kubernetes API: this node's non-terminal pods whose containers (init containers too)
//!   request or limit `nvidia.com/*` or `google.com/tpu`;
//! - NVML: processes with a compute context on each GPU.
//!
//! A witness is [`Witness::Off`] where it does not apply (no Kubernetes, `gpu.enabled = off`),
//! and [`Witness::Unknown`] where it applies but cannot answer now: unknown is not idle (the safe
//! side). The pods of opted-in workers may hold accelerators only while every worker of that pod
//! says `idle`; a GPU's compute processes are allowed only on a GPU an idle worker was given by
//! name (its GPU ids), since NVML does not say whose a process is.
//!
//! Every reason a node is not idle has a stable name ([`BusyReason::as_str`]), shown in the
//! trail (`idle-check`), the logs and the metric `vigil_opportunistic_busy{reason}`.

use std::collections::{BTreeMap, BTreeSet};

use std::time::Duration;

use crate::accel::gpu::model::{selects, GpuMonitorState, GpuReport, GpuStatus};
use crate::config::{GpuConfig, Switch};
use strum::{IntoStaticStr, VariantArray};

/// A GPU report older than this many sampling intervals is no answer: NVML reads have been
/// failing (the monitor keeps the last report) and the processes may have changed.
pub(crate) const STALE_SAMPLES: u32 = 3;

/// A pod by namespace and name.
pub(crate) type PodKey = (String, String);

/// What one witness says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Witness<T> {
    /// Not consulted on this node (it does not apply here).
    Off,
    /// It applies but could not answer now, and why: counts as not idle.
    Unknown(String),
    /// Its answer.
    Known(T),
}

/// An answer, or why there is none.
impl<T> From<Result<T, String>> for Witness<T> {
    fn from(r: Result<T, String>) -> Self {
        r.map_or_else(Witness::Unknown, Witness::Known)
    }
}

impl<T> Witness<T> {
    /// Its answer, where it gave one; where it applies but could not answer, `busy` says so
    /// under `unknown`.
    fn known(&self, busy: &mut Busy, unknown: BusyReason) -> Option<&T> {
        match self {
            Witness::Known(t) => Some(t),
            Witness::Unknown(why) => {
                busy.add(unknown, why.clone());
                None
            }
            Witness::Off => None,
        }
    }
}

/// One running opted-in worker, as its record and the runtime describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkerUse {
    pub(crate) worker: String,
    /// Its recorded `state` (`None`: no record).
    pub(crate) state: Option<String>,
    /// The pod it runs in, on Kubernetes.
    pub(crate) pod: Option<PodKey>,
    /// The GPUs it was given (index, UUID or `nvidiaN`); `None`: all of them, or unknown.
    pub(crate) gpus: Option<Vec<String>>,
}

impl WorkerUse {
    fn idle(&self) -> bool {
        self.state.as_deref().is_some_and(|s| s.trim().eq_ignore_ascii_case("idle"))
    }
}

/// Everything the idle check reads, gathered by `crate::maintenance::opportunistic`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IdleInputs {
    /// The running opted-in workers.
    pub(crate) workers: Witness<Vec<WorkerUse>>,
    /// Pods the kubelet gave accelerator devices (PodResources API).
    pub(crate) pod_resources: Witness<BTreeSet<PodKey>>,
    /// Non-terminal pods of this node that request accelerators (Kubernetes API).
    pub(crate) pods: Witness<BTreeSet<PodKey>>,
    /// NVML's GPUs, with their compute processes.
    pub(crate) gpus: Witness<Vec<GpuStatus>>,
}

/// Why a node is not idle. The names are stable: the trail, logs and metric labels use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum BusyReason {
    /// The runtime's list of workers, or a worker's record, cannot be read.
    WorkersUnknown,
    /// An opted-in worker's record says something other than `idle` (or there is none).
    WorkerNotIdle,
    /// The kubelet's PodResources API applies but did not answer.
    PodResourcesUnknown,
    /// The Kubernetes API's pod list applies but did not answer.
    PodsUnknown,
    /// A pod other than an idle worker's holds or requests an accelerator.
    AcceleratorPod,
    /// NVML applies but gave no answer (not loaded, stale, a GPU whose processes are unreadable
    /// or which went missing).
    NvmlUnknown,
    /// A GPU no idle worker was given has a compute process.
    GpuComputeProcess,
}

impl BusyReason {
    /// Every reason, for the docs drift check and the metric's series.
    pub const ALL: &'static [BusyReason] = <BusyReason as strum::VariantArray>::VARIANTS;

    /// A witness that could not answer (as opposed to one that saw work).
    pub(crate) fn is_unknown(self) -> bool {
        use BusyReason as B;
        matches!(self, B::WorkersUnknown | B::PodResourcesUnknown | B::PodsUnknown | B::NvmlUnknown)
    }
}
as_str!(pub BusyReason);

/// The verdict: every reason the node is not idle, each with what was seen. Empty = idle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Busy {
    pub(crate) reasons: BTreeMap<BusyReason, Vec<String>>,
}

impl Busy {
    pub(crate) fn idle(&self) -> bool {
        self.reasons.is_empty()
    }

    /// The reasons' names, in a fixed order.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        self.reasons.keys().map(|r| r.as_str()).collect()
    }

    /// `reason: what; what | reason: …`, or `idle`, for the trail and logs.
    pub(crate) fn detail(&self) -> String {
        if self.idle() {
            return "idle: no worker busy, no accelerator pod, no compute process".into();
        }
        let parts = self.reasons.iter().map(|(r, s)| format!("{}: {}", r.as_str(), s.join("; ")));
        format!("not idle: {}", parts.collect::<Vec<_>>().join(" | "))
    }

    fn add(&mut self, reason: BusyReason, seen: String) {
        let list = self.reasons.entry(reason).or_default();
        if !list.contains(&seen) {
            list.push(seen);
        }
    }
}

/// Whether the node is idle, and if not, why (see the module header for the rules).
pub(crate) fn idle_check(i: &IdleInputs) -> Busy {
    let mut busy = Busy::default();
    let workers =
        i.workers.known(&mut busy, BusyReason::WorkersUnknown).map_or(&[][..], Vec::as_slice);
    for w in workers.iter().filter(|w| !w.idle()) {
        let state = w.state.as_deref().unwrap_or("no record");
        busy.add(BusyReason::WorkerNotIdle, format!("{} is {state}", w.worker));
    }
    let allowed = idle_pods(workers);
    for (witness, unknown, source) in [
        (
            &i.pod_resources,
            BusyReason::PodResourcesUnknown,
            "holds accelerator devices (kubelet PodResources)",
        ),
        (&i.pods, BusyReason::PodsUnknown, "requests accelerators (Kubernetes API)"),
    ] {
        let holders = witness.known(&mut busy, unknown).into_iter().flatten();
        for (ns, pod) in holders.filter(|p| !allowed.contains(*p)) {
            busy.add(BusyReason::AcceleratorPod, format!("{ns}/{pod} {source}"));
        }
    }
    for g in i.gpus.known(&mut busy, BusyReason::NvmlUnknown).into_iter().flatten() {
        gpu_use(g, workers, &mut busy);
    }
    busy
}

/// NVML as a witness: off where `gpu.enabled = off` or the node has no NVIDIA GPU (no device
/// file, no NVIDIA PCI display function: no compute process can exist); unknown while NVML is
/// starting, waiting for the driver or hung in a call, or the last report is older than [`STALE_SAMPLES`]
/// sampling intervals (`age`: since it arrived; `None`, never); otherwise the report's GPUs.
pub(crate) fn gpu_witness(
    cfg: &GpuConfig,
    report: &GpuReport,
    age: Option<Duration>,
) -> Witness<Vec<GpuStatus>> {
    use GpuMonitorState as S;
    match report.state {
        _ if cfg.enabled == Switch::Off => return Witness::Off,
        S::Off | S::NoGpu => return Witness::Off,
        S::Starting | S::WaitingForDriver | S::NvmlHung => {
            let state = report.state.as_str();
            return Witness::Unknown(format!("NVML is {state}, so GPU processes cannot be seen"));
        }
        S::On => {}
    }
    let limit = cfg.sample_interval * STALE_SAMPLES;
    let secs = limit.as_secs();
    match age {
        Some(a) if a <= limit => Witness::Known(report.gpus.clone()),
        _ => Witness::Unknown(format!("no GPU sample in the last {secs}s (NVML reads failing?)")),
    }
}

/// The pods whose accelerators are allowed: pods of opted-in workers that all say idle.
fn idle_pods(workers: &[WorkerUse]) -> BTreeSet<&PodKey> {
    let busy: BTreeSet<_> = workers.iter().filter(|w| !w.idle()).flat_map(|w| &w.pod).collect();
    workers.iter().flat_map(|w| &w.pod).filter(|p| !busy.contains(p)).collect()
}

/// One GPU's compute processes: allowed only on a GPU an idle worker was given by name.
fn gpu_use(g: &GpuStatus, workers: &[WorkerUse], busy: &mut Busy) {
    let name = format!("GPU {} ({})", g.index, g.uuid);
    let held_by_idle_worker = workers.iter().any(|w| {
        w.idle() && w.gpus.as_ref().is_some_and(|ids| ids.iter().any(|id| selects(g, id)))
    });
    match g.sample.compute_processes {
        _ if g.missing => busy.add(BusyReason::NvmlUnknown, format!("{name} is missing")),
        None => busy.add(BusyReason::NvmlUnknown, format!("{name}: compute processes unreadable")),
        Some(n) if n > 0 && !held_by_idle_worker => busy.add(
            BusyReason::GpuComputeProcess,
            format!("{name}: {n} compute process(es), on no GPU an idle worker was given"),
        ),
        Some(_) => {}
    }
}

#[cfg(test)]
#[path = "policy_idle_tests.rs"]
mod tests;
