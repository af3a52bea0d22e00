//! Unit tests of the CRI runtime's pure parts.
use super::*;

#[test]
fn host_pid_comes_from_the_verbose_info() {
    let mut info = HashMap::new();
    assert_eq!(host_pid(&info), None);
    info.insert("info".to_string(), r#"{"pid": 4242, "sandboxID": "x"}"#.to_string());
    assert_eq!(host_pid(&info), Some(4242));
    info.insert("info".to_string(), "not json".to_string());
    assert_eq!(host_pid(&info), None);
    // An exited container's (containerd says 0): never signalled as a process group.
    for pid in ["0", "-1"] {
        info.insert("info".to_string(), format!(r#"{{"pid": {pid}}}"#));
        assert_eq!(host_pid(&info), None, "{pid}");
    }
}

/// A container of `sandbox` as ListContainers gives it: attempt `attempt` of `name`, created at
/// `created_at` (ns), in `state`.
fn listed(
    id: &str,
    sandbox: &str,
    name: &str,
    attempt: u32,
    created_at: i64,
    state: ContainerState,
) -> CriContainer {
    CriContainer {
        id: id.into(),
        pod_sandbox_id: sandbox.into(),
        metadata: Some(k8s_cri::v1::ContainerMetadata { name: name.into(), attempt }),
        state: state as i32,
        created_at,
        ..Default::default()
    }
}

/// Of each container of a ready sandbox, its newest attempt speaks, whatever its state: a worker
/// in kubelet's back-off (its last attempt exited, the next not created yet) is listed exited,
/// not missing. A deleted pod's containers (its sandbox not ready) never are, nor an attempt
/// created and not started yet.
#[test]
fn the_newest_attempt_of_each_container_of_a_ready_sandbox_speaks_whatever_its_state() {
    use k8s_cri::v1::ContainerState::{ContainerCreated, ContainerExited, ContainerRunning};
    let all = vec![
        listed("main-0", "pod-a", "main", 0, 100, ContainerExited),
        listed("main-2", "pod-a", "main", 2, 300, ContainerExited),
        listed("main-1", "pod-a", "main", 1, 200, ContainerExited),
        listed("main-3", "pod-a", "main", 3, 400, ContainerCreated),
        listed("side-0", "pod-a", "sidecar", 0, 100, ContainerRunning),
        listed("tie-old", "pod-a", "tie", 1, 100, ContainerExited),
        listed("tie-new", "pod-a", "tie", 1, 150, ContainerRunning),
        listed("b-main-0", "pod-b", "main", 0, 100, ContainerRunning),
        listed("deleted-0", "pod-deleted", "main", 5, 900, ContainerExited),
    ];
    // The sandboxes ListPodSandbox gives as ready: not the deleted pod's.
    let ready: std::collections::HashSet<&str> = ["pod-a", "pod-b"].into();
    let kept = newest_attempts(all, |sb| ready.contains(sb));
    let mut ids: Vec<&str> = kept.iter().map(|c| c.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["b-main-0", "main-2", "side-0", "tie-new"]);
    let backoff = kept.iter().find(|c| c.id == "main-2").unwrap();
    assert_eq!(backoff.state, ContainerExited as i32, "listed as it is: exited");
}

#[test]
fn the_log_tail_starts_at_a_line() {
    let dir = std::env::temp_dir().join(format!("vigil-cri-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("0.log");
    let line = "2026-11-30T02:14:00Z stdout F ".to_string() + &"x".repeat(100) + "\n";
    let big = line.repeat((LOG_TAIL_BYTES as usize / line.len()) + 10);
    std::fs::write(&path, &big).unwrap();
    let tail = read_tail(path.to_str().unwrap()).unwrap();
    assert!(tail.len() as u64 <= LOG_TAIL_BYTES);
    assert!(tail.starts_with("2026-11-30T02:14:00Z"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stand-in for the API that counts its reads: a JobSet's Never pod.
struct Counting(std::sync::atomic::AtomicUsize);

#[async_trait]
impl PodApi for Counting {
    async fn node_pods(
        &self,
        _: &str,
    ) -> Result<Vec<crate::kube::pods::NodePod>, crate::kube::pods::PodError> {
        Ok(Vec::new())
    }
    async fn workload(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
    ) -> Result<Option<crate::vocab::workload::Workload>, crate::kube::pods::PodError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let policy = crate::vocab::workload::RestartPolicy::Always;
        let pod = format!("{ns}/{pod}");
        Ok(Some(crate::vocab::workload::Workload::bare(&pod, container, policy)))
    }
}

/// A gang member's entry, once a cycle while its worker is in trouble, reads its pod once a
/// minute, not every cycle; the read right before its restart is always fresh.
#[tokio::test]
async fn a_members_entry_reuses_a_recent_read_and_a_restart_never_does() {
    let api = Arc::new(Counting(std::sync::atomic::AtomicUsize::new(0)));
    let settings = CriSettings {
        socket: "/nonexistent/vigil-test.sock".into(),
        worker_label: "vigil.worker".into(),
        checkpoint_annotation: "vigil.checkpoint".into(),
        call_timeout: Duration::from_secs(1),
        allow_pod_replacement: false,
        poll: Duration::from_millis(100),
    };
    let rt = CriRuntime::new(settings, Some(api.clone()));
    let c = Container { worker: "rank-0".into(), ..crate::runtime::container::in_pod(false) };
    for _ in 0..3 {
        let r = rt.remediation(&c, Stops::EveryPod).await;
        assert!(r.restarted_in_place(), "{r:?}");
    }
    assert_eq!(api.0.load(Ordering::SeqCst), 1, "one read for three entries");
    rt.remediation(&c, Stops::One).await;
    rt.remediation(&c, Stops::One).await;
    assert_eq!(api.0.load(Ordering::SeqCst), 3, "a restart reads afresh");
}
