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
