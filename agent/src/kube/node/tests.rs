//! Unit tests of the Node API adapter's pure parts.

use super::*;

#[test]
fn notes_fit_the_api_limit_on_a_char_boundary() {
    assert_eq!(note("short"), "short");
    let exact = "a".repeat(NOTE_LIMIT);
    assert_eq!(note(&exact), exact);
    let long = "é".repeat(NOTE_LIMIT);
    let cut = note(&long);
    assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
    assert!(cut.ends_with('…'));
    assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
}

#[test]
fn actions_are_short_and_never_empty() {
    for reason in ["VigilCheckpoint", "VigilPerformMaintenance", "VigilGpuFailed", ""] {
        let action = action_for(reason);
        assert!(!action.is_empty() && action.len() <= 128, "{reason}: {action}");
    }
}

#[tokio::test]
async fn bad_url_is_an_error_not_a_panic() {
    assert!(matches!(KubeNodeApi::from_url("not a url"), Err(NodeError::Client { .. })));
}

#[test]
fn outside_a_runtime_is_an_error_not_a_panic() {
    assert!(matches!(KubeNodeApi::from_url("http://127.0.0.1:1"), Err(NodeError::Client { .. })));
}
