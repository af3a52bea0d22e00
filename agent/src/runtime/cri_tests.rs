//! Unit tests of the CRI runtime's pure parts.
use super::*;

#[test]
fn the_host_pod_stands_for_the_pod_s_ip() {
    let m = "http://pod:8080/checkpoint?x=1";
    assert!(addresses_the_pod(m));
    assert_eq!(
        at_pod_ip(m, "10.4.0.17"),
        "http://10.4.0.17:8080/checkpoint?x=1"
    );
    assert_eq!(at_pod_ip(m, ""), "http://127.0.0.1:8080/checkpoint?x=1");
    assert_eq!(
        at_pod_ip(m, "fd00::17"),
        "http://[fd00::17]:8080/checkpoint?x=1"
    );
    for other in [
        "http://podium:80/",
        "http://10.0.0.1/pod",
        "signal:SIGUSR1",
        "record",
    ] {
        assert!(!addresses_the_pod(other), "{other}");
    }
}

#[test]
fn host_pid_comes_from_the_verbose_info() {
    let mut info = HashMap::new();
    assert_eq!(host_pid(&info), None);
    info.insert(
        "info".to_string(),
        r#"{"pid": 4242, "sandboxID": "x"}"#.to_string(),
    );
    assert_eq!(host_pid(&info), Some(4242));
    info.insert("info".to_string(), "not json".to_string());
    assert_eq!(host_pid(&info), None);
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
