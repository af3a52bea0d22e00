//! The idle check, table-driven: each reason alone, the witnesses that do not apply, and the
//! allowances (an idle worker's pod, an idle worker's GPU).

use super::*;
use crate::accel::gpu::model::{GpuReport, GpuSample};

fn pod(ns: &str, name: &str) -> PodKey {
    (ns.to_string(), name.to_string())
}

fn worker(
    id: &str,
    state: Option<&str>,
    p: Option<(&str, &str)>,
    gpus: Option<&[&str]>,
) -> WorkerUse {
    WorkerUse {
        worker: id.into(),
        state: state.map(str::to_string),
        pod: p.map(|(ns, n)| pod(ns, n)),
        gpus: gpus.map(|g| g.iter().map(|s| s.to_string()).collect()),
    }
}

fn gpu(index: u32, procs: Option<u32>) -> GpuStatus {
    GpuStatus {
        index,
        uuid: format!("GPU-{index}"),
        sample: GpuSample {
            index,
            uuid: format!("GPU-{index}"),
            minor_number: Some(index),
            compute_processes: procs,
            ..GpuSample::default()
        },
        ..GpuStatus::default()
    }
}

fn holders(pods: &[(&str, &str)]) -> Witness<BTreeSet<PodKey>> {
    Witness::Known(pods.iter().map(|(ns, n)| pod(ns, n)).collect())
}

/// Every witness answers and sees nothing: one idle worker in pod ml/w0 on GPU 0.
fn quiet() -> IdleInputs {
    IdleInputs {
        workers: Witness::Known(vec![worker("w0", Some("idle"), Some(("ml", "w0")), Some(&["0"]))]),
        pod_resources: holders(&[("ml", "w0")]),
        pods: holders(&[("ml", "w0")]),
        gpus: Witness::Known(vec![gpu(0, Some(0)), gpu(1, Some(0))]),
    }
}

fn reasons(i: &IdleInputs) -> Vec<&'static str> {
    idle_check(i).names()
}

#[test]
fn a_quiet_node_is_idle_and_says_so() {
    let b = idle_check(&quiet());
    assert!(b.idle(), "{b:?}");
    assert!(b.detail().starts_with("idle"), "{}", b.detail());
}

#[test]
fn each_reason_alone() {
    type Edit = fn(&mut IdleInputs);
    let cases: &[(&str, Edit, &str)] = &[
        (
            "the runtime cannot list the workers",
            |i| {
                i.workers = Witness::Unknown("runtime down".into());
                i.pod_resources = holders(&[]);
                i.pods = holders(&[]);
            },
            "workers-unknown",
        ),
        (
            "a worker is processing",
            |i| {
                i.workers = Witness::Known(vec![worker("w0", Some("processing"), None, None)]);
                i.pod_resources = holders(&[]);
                i.pods = holders(&[]);
            },
            "worker-not-idle",
        ),
        (
            "a worker has no record",
            |i| {
                i.workers = Witness::Known(vec![worker("w0", None, None, None)]);
                i.pod_resources = holders(&[]);
                i.pods = holders(&[]);
            },
            "worker-not-idle",
        ),
        (
            "the kubelet does not answer",
            |i| i.pod_resources = Witness::Unknown("no socket".into()),
            "pod-resources-unknown",
        ),
        (
            "the API server does not answer",
            |i| i.pods = Witness::Unknown("forbidden".into()),
            "pods-unknown",
        ),
        (
            "the kubelet gave another pod a GPU",
            |i| i.pod_resources = holders(&[("ml", "w0"), ("team", "job")]),
            "accelerator-pod",
        ),
        (
            "another pod requests a GPU",
            |i| i.pods = holders(&[("ml", "w0"), ("team", "job")]),
            "accelerator-pod",
        ),
        (
            "NVML is not loaded",
            |i| i.gpus = Witness::Unknown("NVML not loaded".into()),
            "nvml-unknown",
        ),
        (
            "a GPU's processes cannot be read",
            |i| i.gpus = Witness::Known(vec![gpu(0, Some(0)), gpu(1, None)]),
            "nvml-unknown",
        ),
        (
            "a GPU went missing",
            |i| {
                let mut g = gpu(1, Some(0));
                g.missing = true;
                i.gpus = Witness::Known(vec![gpu(0, Some(0)), g]);
            },
            "nvml-unknown",
        ),
        (
            "a process on a GPU no worker was given",
            |i| i.gpus = Witness::Known(vec![gpu(0, Some(0)), gpu(1, Some(2))]),
            "gpu-compute-process",
        ),
    ];
    for (what, edit, want) in cases {
        let mut i = quiet();
        edit(&mut i);
        assert_eq!(reasons(&i), vec![*want], "{what}");
    }
}

#[test]
fn a_node_without_opted_in_workers_is_busy_when_a_pod_holds_a_gpu() {
    // The bug this check exists for: no opted-in worker used to mean "idle".
    let i = IdleInputs {
        workers: Witness::Known(vec![]),
        pod_resources: holders(&[("team", "train")]),
        pods: holders(&[("team", "train")]),
        gpus: Witness::Known(vec![gpu(0, Some(1))]),
    };
    let b = idle_check(&i);
    assert_eq!(b.names(), vec!["accelerator-pod", "gpu-compute-process"]);
    assert_eq!(
        b.reasons[&BusyReason::AcceleratorPod],
        vec![
            "team/train holds accelerator devices (kubelet PodResources)".to_string(),
            "team/train requests accelerators (Kubernetes API)".to_string(),
        ]
    );
    let d = b.detail();
    assert!(d.starts_with("not idle: accelerator-pod: team/train"), "{d}");
}

#[test]
fn witnesses_that_do_not_apply_are_not_asked() {
    // A Docker host with `gpu.enabled = off`: only the workers speak.
    let i = IdleInputs {
        workers: Witness::Known(vec![worker("w0", Some("idle"), None, None)]),
        pod_resources: Witness::Off,
        pods: Witness::Off,
        gpus: Witness::Off,
    };
    assert!(idle_check(&i).idle());
    let none = IdleInputs { workers: Witness::Off, ..i };
    assert!(idle_check(&none).idle());
}

#[test]
fn a_busy_workers_pod_may_not_hold_a_gpu_and_one_busy_worker_spoils_its_pod() {
    let mut i = quiet();
    i.workers = Witness::Known(vec![
        worker("w0", Some("idle"), Some(("ml", "w0")), Some(&["0"])),
        worker("w0b", Some("processing"), Some(("ml", "w0")), Some(&["0"])),
    ]);
    let b = idle_check(&i);
    assert_eq!(b.names(), vec!["worker-not-idle", "accelerator-pod"]);
    assert_eq!(b.reasons[&BusyReason::WorkerNotIdle], vec!["w0b is processing".to_string()]);
}

#[test]
fn unknown_workers_allow_no_pod_and_no_gpu() {
    let mut i = quiet();
    i.workers = Witness::Unknown("redis down".into());
    i.gpus = Witness::Known(vec![gpu(0, Some(1))]);
    assert_eq!(reasons(&i), vec!["workers-unknown", "accelerator-pod", "gpu-compute-process"]);
}

#[test]
fn compute_processes_are_allowed_only_on_a_gpu_an_idle_worker_was_given_by_name() {
    // GPU ids as runtimes and device plugins give them: index, UUID, device file.
    for id in ["0", "GPU-0", "gpu-0", "nvidia0"] {
        let mut i = quiet();
        i.workers =
            Witness::Known(vec![worker("w0", Some("idle"), Some(("ml", "w0")), Some(&[id]))]);
        i.gpus = Witness::Known(vec![gpu(0, Some(3)), gpu(1, Some(0))]);
        assert!(idle_check(&i).idle(), "{id}");
    }
    // Given all GPUs (`--gpus all`, or unknown): a process could be anyone's.
    let mut i = quiet();
    i.workers = Witness::Known(vec![worker("w0", Some("idle"), Some(("ml", "w0")), None)]);
    i.gpus = Witness::Known(vec![gpu(0, Some(1))]);
    assert_eq!(reasons(&i), vec!["gpu-compute-process"]);
    // Given GPU 0 but the process is on GPU 1.
    let mut i = quiet();
    i.gpus = Witness::Known(vec![gpu(0, Some(0)), gpu(1, Some(1))]);
    let b = idle_check(&i);
    assert_eq!(
        b.reasons[&BusyReason::GpuComputeProcess],
        vec!["GPU 1 (GPU-1): 1 compute process(es), on no GPU an idle worker was given".to_string()]
    );
    // The worker on GPU 0 is busy: its processes count (and its record says so).
    let mut i = quiet();
    i.workers =
        Witness::Known(vec![worker("w0", Some("processing"), Some(("ml", "w0")), Some(&["0"]))]);
    i.gpus = Witness::Known(vec![gpu(0, Some(1))]);
    assert_eq!(reasons(&i), vec!["worker-not-idle", "accelerator-pod", "gpu-compute-process"]);
}

#[test]
fn every_witness_unknown_names_every_unknown_reason() {
    let i = IdleInputs {
        workers: Witness::Unknown("a".into()),
        pod_resources: Witness::Unknown("b".into()),
        pods: Witness::Unknown("c".into()),
        gpus: Witness::Unknown("d".into()),
    };
    let b = idle_check(&i);
    assert_eq!(
        b.names(),
        vec!["workers-unknown", "pod-resources-unknown", "pods-unknown", "nvml-unknown"]
    );
    assert!(b.reasons.keys().all(|r| r.is_unknown()));
}

#[test]
fn names_are_stable_and_distinct() {
    let names: BTreeSet<_> = BusyReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(names.len(), BusyReason::ALL.len());
    assert!(!BusyReason::AcceleratorPod.is_unknown());
    assert!(!BusyReason::WorkerNotIdle.is_unknown());
    assert!(!BusyReason::GpuComputeProcess.is_unknown());
}

#[test]
fn a_worker_state_is_read_as_workers_write_it() {
    for (state, idle) in
        [("idle", true), ("IDLE", true), (" idle ", true), ("processing", false), ("", false)]
    {
        let w = worker("w", Some(state), None, None);
        assert_eq!(w.idle(), idle, "{state:?}");
    }
}

#[test]
fn nvml_is_a_witness_only_where_gpus_are_watched_and_fresh() {
    use crate::accel::gpu::model::GpuMonitorState;
    use crate::config::{GpuConfig, Switch};
    use std::time::Duration;
    let on = GpuReport {
        state: GpuMonitorState::On,
        gpus: vec![gpu(0, Some(0))],
        ..GpuReport::default()
    };
    let cfg = GpuConfig::default(); // auto, 15 s
    let fresh = Some(Duration::from_secs(45));
    assert_eq!(gpu_witness(&cfg, &on, fresh), Witness::Known(on.gpus.clone()));
    let stale = Some(Duration::from_secs(46));
    assert!(matches!(gpu_witness(&cfg, &on, stale), Witness::Unknown(_)));
    assert!(matches!(gpu_witness(&cfg, &on, None), Witness::Unknown(_)));
    // Not loaded yet: the node has GPUs, their processes cannot be seen.
    for state in [GpuMonitorState::Starting, GpuMonitorState::WaitingForDriver] {
        let r = GpuReport { state, ..GpuReport::default() };
        match gpu_witness(&cfg, &r, fresh) {
            Witness::Unknown(why) => assert!(why.contains(state.as_str()), "{why}"),
            w => panic!("{state:?}: {w:?}"),
        }
    }
    // No NVIDIA GPU on the node: no compute process can exist.
    let none = GpuReport { state: GpuMonitorState::NoGpu, ..GpuReport::default() };
    assert_eq!(gpu_witness(&cfg, &none, None), Witness::Off);
    let off = GpuReport::default();
    let disabled = GpuConfig { enabled: Switch::Off, ..GpuConfig::default() };
    assert_eq!(gpu_witness(&disabled, &off, None), Witness::Off);
}
