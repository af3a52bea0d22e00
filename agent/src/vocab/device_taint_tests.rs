use super::*;

fn gpu(i: u32) -> Device {
    Device {
        driver: "gpu.nvidia.com".into(),
        pool: "gpu-node-7".into(),
        name: format!("gpu-{i}"),
        uuid: Some(format!("GPU-{i:04}")),
        parent_uuid: None,
    }
}

fn existing(name: &str, gpu: &str, effect: &str) -> Existing {
    Existing { name: name.into(), gpu: Some(gpu.into()), effect: Some(effect.into()) }
}

#[test]
fn a_failed_gpu_is_one_rule_for_its_device_and_a_recovered_one_is_deleted() {
    let devices: Vec<Device> = (0..8).map(gpu).collect();
    let p = plan("gpu-node-7", &devices, &["GPU-0003".into()], &[], false);
    assert_eq!(p.create.len(), 1);
    let name = rule_name("gpu-node-7", &gpu(3));
    assert_eq!(p.create[0].name, name);
    assert!(name.starts_with("vigil-gpu-node-7-gpu-3-"), "{name}");
    assert_eq!(p.create[0].device, gpu(3));
    assert_eq!(p.create[0].effect, "NoSchedule");
    assert!(p.delete.is_empty() && p.unmatched.is_empty());
    // Already there: nothing to write.
    let had = [existing(&name, "GPU-0003", "NoSchedule")];
    let same = plan("gpu-node-7", &devices, &["GPU-0003".into()], &had, false);
    assert_eq!(same, Plan::default());
    // Recovered: its rule goes.
    let healed = plan("gpu-node-7", &devices, &[], &had, false);
    assert_eq!(healed.delete, [name]);
}

#[test]
fn observe_mode_shows_the_taint_and_a_change_of_mode_replaces_the_rule() {
    let p = plan("n", &[gpu(0)], &["GPU-0000".into()], &[], true);
    assert_eq!(p.create[0].effect, "None");
    let name = rule_name("n", &gpu(0));
    let observed = [existing(&name, "GPU-0000", "None")];
    let p = plan("n", &[gpu(0)], &["GPU-0000".into()], &observed, false);
    assert_eq!(p.delete, std::slice::from_ref(&name));
    assert_eq!(p.create.len(), 1);
    assert_eq!(p.create[0].effect, "NoSchedule");
}

#[test]
fn a_failed_gpu_no_device_stands_for_is_said_and_its_rule_stands() {
    let mut unnamed = gpu(1);
    unnamed.uuid = None;
    let p = plan("n", &[unnamed], &["GPU-0001".into()], &[], false);
    assert!(p.create.is_empty());
    assert_eq!(p.unmatched, ["GPU-0001"]);
    // The slices gone for a moment (the driver restarting): the rule made before stands.
    let name = rule_name("n", &gpu(1));
    let had = [existing(&name, "GPU-0001", "NoSchedule")];
    let p = plan("n", &[], &["GPU-0001".into()], &had, false);
    assert!(p.delete.is_empty(), "{p:?}");
    // Renumbered: the rule moves to the device that now stands for the GPU.
    let mut moved = gpu(5);
    moved.uuid = Some("GPU-0001".into());
    let p = plan("n", &[moved.clone()], &["GPU-0001".into()], &had, false);
    assert_eq!(p.delete, [name]);
    assert_eq!(p.create[0].device, moved);
}

#[test]
fn every_mig_device_of_a_failed_gpu_is_tainted() {
    let mig = |i: u32| Device {
        name: format!("gpu-0-mig-{i}"),
        uuid: Some(format!("MIG-{i}")),
        parent_uuid: Some("GPU-0000".into()),
        ..gpu(0)
    };
    let p = plan("n", &[mig(0), mig(1), gpu(1)], &["GPU-0000".into()], &[], false);
    let names: Vec<&str> = p.create.iter().map(|r| r.device.name.as_str()).collect();
    assert_eq!(names, ["gpu-0-mig-0", "gpu-0-mig-1"]);
}

#[test]
fn names_and_label_values_stay_within_the_apis_limits_and_never_collide() {
    let long = "x".repeat(253);
    let n = rule_name(&long, &gpu(0));
    assert!(n.len() <= 253, "{}", n.len());
    // Dashes cannot make two devices one name.
    let a = Device { name: "b-c".into(), ..gpu(0) };
    let b = Device { name: "c".into(), ..gpu(0) };
    assert_ne!(rule_name("a", &a), rule_name("a-b", &b));
    assert_eq!(node_label("gpu-node-7"), "gpu-node-7");
    let hashed = node_label(&long);
    assert!(hashed.starts_with("h-") && hashed.len() <= 63, "{hashed}");
    assert_ne!(node_label(&long), node_label(&"y".repeat(253)));
}
