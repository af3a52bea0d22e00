//! Unit tests of the CRI runtime's pure parts.
use super::*;

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
