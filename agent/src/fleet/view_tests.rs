//! The fleet view: records, health, slices and the table.

use super::*;

fn rec(node: &str, slice: &str, maint: &str, gpu: &str, verdict: &str) -> NodeRecord {
    NodeRecord {
        node: node.into(),
        pool: "p".into(),
        slice: slice.into(),
        provisioning: "spot".into(),
        accelerator: "tpu-v5p-slice".into(),
        tpu_topology: "2x2x4".into(),
        maintenance: maint.into(),
        maintenance_source: if maint == "none" { String::new() } else { "node-labels".into() },
        gpu: gpu.into(),
        workers: [("w".to_string(), verdict.to_string())].into(),
        places: Default::default(),
        gangs: Default::default(),
        version: "0.1.0".into(),
        dry_run: false,
        updated_at: 1000,
        ..NodeRecord::default()
    }
}

fn view(r: NodeRecord) -> NodeView {
    NodeView {
        node: r.node.clone(),
        health: health(Some(&r)),
        last_seen: r.updated_at,
        record: Some(r),
    }
}

#[test]
fn record_round_trips_through_fields() {
    let r = rec("n1", "s1", "none", "healthy", "healthy");
    let map = r.fields().into_iter().collect();
    assert_eq!(NodeRecord::from_fields(&map), Some(r));
}

#[test]
fn a_slice_is_available_only_when_every_node_is_healthy() {
    let views = vec![
        view(rec("a1", "A", "none", "healthy", "healthy")),
        view(rec("a2", "A", "none", "unknown", "booting")),
        view(rec("b1", "B", "none", "healthy", "healthy")),
        view(rec("b2", "B", "pending", "healthy", "healthy")),
        view(rec("c1", "C", "none", "failed", "healthy")),
        view(rec("d1", "D", "none", "healthy", "hung")),
    ];
    let s = slices(&views, &Places::new());
    let avail: Vec<_> = s.iter().map(|s| (s.slice.as_str(), s.available)).collect();
    assert_eq!(avail, vec![("A", true), ("B", false), ("C", false), ("D", false)]);
    assert_eq!(s[1].maintenance, 1);
}

#[test]
fn the_table_shows_what_the_node_labels_said_and_the_maintenance_source() {
    let views = vec![
        view(rec("a1", "A", "ongoing", "healthy", "in-maintenance")),
        view(NodeRecord {
            provisioning: String::new(),
            accelerator: String::new(),
            tpu_topology: String::new(),
            ..rec("b1", "", "none", "unknown", "healthy")
        }),
    ];
    let text = render(&views, &slices(&views, &Places::new()), 5000);
    let header = text.lines().next().unwrap();
    for col in ["PROVISIONING", "ACCELERATOR", "TOPOLOGY", "MAINTENANCE", "SOURCE"] {
        assert!(header.contains(col), "{header}");
    }
    let a1 = text.lines().find(|l| l.starts_with("a1")).unwrap();
    for cell in ["spot", "tpu-v5p-slice", "2x2x4", "ongoing", "node-labels"] {
        assert!(a1.contains(cell), "{cell}: {a1}");
    }
    let b1: Vec<&str> =
        text.lines().find(|l| l.starts_with("b1")).unwrap().split_whitespace().collect();
    // node pool slice provisioning accelerator topology health maintenance source
    assert_eq!(b1[..9], ["b1", "p", "-", "-", "-", "-", "healthy", "none", "-"]);
}

#[test]
fn a_down_node_makes_its_slice_unavailable() {
    let mut views = vec![view(rec("a1", "A", "none", "healthy", "healthy"))];
    views.push(NodeView { node: "a2".into(), health: health(None), last_seen: 10, record: None });
    let last = [("a2".to_string(), ("p".to_string(), "A".to_string()))].into();
    let s = slices(&views, &last);
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].down, s[0].available), (1, false));
    assert!(render(&views, &s, 5000).contains("down"));
}

/// A node whose runtime cannot list its workers shows their verdicts as last seen: said so in
/// the table, and the node is `unknown` — never counted healthy (its pool's healthy count lets
/// an idle node go to maintenance), nor unhealthy (its slice stays available: Vigil lost sight of
/// the training, the training did not stop); a failed GPU, a fresh fact, or a worker last seen
/// hung still makes it unhealthy.
#[test]
fn a_node_whose_runtime_is_down_is_unknown_and_says_its_verdicts_are_as_last_seen() {
    let mut r = rec("n1", "s1", "none", "healthy", "healthy");
    r.runtime_down = Some(1_000);
    let map = r.fields().into_iter().collect();
    assert_eq!(NodeRecord::from_fields(&map), Some(r.clone()));
    let v = view(r.clone());
    assert_eq!(v.health, "unknown");
    let s = slices(std::slice::from_ref(&v), &Places::new());
    assert_eq!((s[0].unknown, s[0].healthy, s[0].available), (1, 0, true));
    let table = render(&[v], &s, 121_000);
    assert!(table.contains("(runtime down for 2m; as last seen:) w=healthy"), "{table}");
    assert!(table.contains("UNKNOWN"), "{table}");
    let mut hung = r.clone();
    hung.workers = [("w".to_string(), "hung".to_string())].into();
    assert_eq!(view(hung).health, "unhealthy");
    r.gpu = "failed".into();
    assert_eq!(view(r).health, "unhealthy");
    let up = view(rec("n2", "s1", "none", "healthy", "healthy"));
    assert_eq!(up.health, "healthy");
    assert!(!render(&[up], &[], 121_000).contains("runtime down"));
}
