//! Which gang a worker is a member of (pure): the tenancy rule between what its record says
//! (`gang`, `gang_size`, written by the worker) and what its pod's labels say (written by its
//! controller: JobSet, an Indexed Job, LeaderWorkerSet, or the `<opt-in label>.gang` label).
//!
//! NB: a record is the worker's own word, and any tenant with a worker anywhere in the fleet can
//! write one (issue 41). Taken verbatim, a record naming `ml/jobset/train/0` put a pod of the
//! `research` namespace into ml's gang view, where a fresh beat made ml's hung ranks stragglers
//! (never restarted), its node's notice opened a checkpoint round for ml's job and shrank its
//! budget, and the gang's pages could be placed at it. So:
//! - where the pod's labels derive a gang, the labels win: the pod's controller set them and
//!   its worker cannot change them, so a record can neither move the pod into another gang nor
//!   resize the one it is in (the size comes from the labels only, or is unknown);
//! - otherwise, where the worker has a namespace (Kubernetes: CRI, or Docker under a kubelet), a
//!   record's gang is always of its own namespace: the id the agent uses is `<namespace>/<value>`
//!   (a value that already begins with `<namespace>/` is taken as it is). A namespace is a DNS
//!   label, with no `/`, so the id's first segment is always the writer's namespace and no other
//!   namespace's id can be spelled;
//! - on a Docker or Podman host outside Kubernetes there are no tenants: the record's gang is
//!   taken as written (anyone who may start a worker container there is root on the node).

use crate::hang::model::{valid_gang_id, Gang};
use crate::runtime::container::{scoped, Container, PodGang};

/// A worker's gang, and what the agent did with the record's own words (for the worker API's
/// answer: a worker learns the id it is known by).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Membership {
    pub(crate) gang: Option<Gang>,
    /// Why the record's `gang` or `gang_size` is not used as written; empty when it is.
    pub(crate) notes: Vec<String>,
    /// The record names a gang that no scoping makes an id: why (the worker API refuses it).
    pub(crate) unusable: Option<String>,
}

/// The gang of a worker whose record names `record`, whose pod's labels name `labels`, in
/// `namespace` (`None`: no Kubernetes, no tenancy).
pub(crate) fn membership(
    record: Option<&Gang>,
    labels: Option<&PodGang>,
    namespace: Option<&str>,
) -> Membership {
    if let Some(l) = labels.filter(|l| valid_gang_id(&l.id)) {
        let gang = Some(Gang { id: l.id.clone(), size: l.size });
        let notes = record.map(|r| overruled(r, l, namespace)).unwrap_or_default();
        return Membership { gang, notes, unusable: None };
    }
    let Some(r) = record else { return Membership::default() };
    let Some(ns) = namespace else {
        return Membership { gang: Some(r.clone()), ..Membership::default() };
    };
    let (asked, id) = (&r.id, scoped(ns, &r.id));
    if !valid_gang_id(&id) {
        let why = format!(
            "gang {asked:?} cannot be used: scoped to namespace {ns} it is {} characters, past the 253 of a gang id",
            id.len()
        );
        return Membership { unusable: Some(why), ..Membership::default() };
    }
    let mut notes = Vec::new();
    if id != *asked {
        notes.push(format!(
            "gang {asked:?} is of namespace {ns}: the agent knows it as {id} (a record names only a gang of its own namespace)"
        ));
    }
    Membership { gang: Some(Gang { id, size: r.size }), notes, unusable: None }
}

/// What of a record's gang the pod's labels overrule, said to the worker.
fn overruled(r: &Gang, l: &PodGang, namespace: Option<&str>) -> Vec<String> {
    let mut notes = Vec::new();
    let asked = namespace.map_or_else(|| r.id.clone(), |ns| scoped(ns, &r.id));
    if asked != l.id {
        notes.push(format!(
            "gang {:?} is not used: this pod's labels ({}) make it a member of {}, and a pod's labels (set by its controller) win over its record",
            r.id, l.source, l.id
        ));
    }
    if let Some(n) = r.size.filter(|n| Some(*n) != l.size) {
        let size = l.size.map_or("unknown".to_string(), |s| s.to_string());
        notes.push(format!(
            "gang_size {n} is not used: the size of a gang named by its pod's labels comes from the labels only (here: {size})"
        ));
    }
    notes
}

/// The gang of container `c`'s worker, whose record names `record`.
pub(crate) fn of_container(c: &Container, record: Option<&Gang>) -> Membership {
    let namespace = c.pod_identity().map(|p| p.namespace);
    membership(record, c.gang.as_ref(), namespace.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gang(id: &str, size: Option<u32>) -> Gang {
        Gang { id: id.into(), size }
    }

    fn jobset(id: &str) -> PodGang {
        PodGang { id: id.into(), size: None, source: "jobset", attempt: None, jobset_uid: None }
    }

    /// The attack: a research pod's record names ml's JobSet gang.
    #[test]
    fn a_record_names_only_a_gang_of_its_own_namespace() {
        let m = membership(Some(&gang("ml/jobset/train/0", Some(3))), None, Some("research"));
        let g = m.gang.clone().unwrap();
        assert_eq!(g.id, "research/ml/jobset/train/0");
        assert_eq!(g.size, Some(3));
        assert!(m.notes[0].contains("research/ml/jobset/train/0"), "{m:?}");
        // Two unrelated jobs that pick the same literal id no longer merge.
        let a = membership(Some(&gang("train", None)), None, Some("ml"));
        let b = membership(Some(&gang("train", None)), None, Some("research"));
        assert_eq!(a.gang.unwrap().id, "ml/train");
        assert_eq!(b.gang.unwrap().id, "research/train");
        // A value already of its own namespace is kept, and says nothing.
        let own = membership(Some(&gang("ml/run-1", None)), None, Some("ml"));
        assert_eq!(own.gang.unwrap().id, "ml/run-1");
        assert!(own.notes.is_empty());
        // The empty namespace is Kubernetes' default.
        assert_eq!(scoped("", "x"), "default/x");
        // Not a prefix by characters: `mlops/x` is not in `ml`.
        assert_eq!(scoped("ml", "mlops/x"), "ml/mlops/x");
        assert_eq!(scoped("ml", "ml/"), "ml/ml/");
    }

    #[test]
    fn the_pod_s_labels_win_and_size_the_gang_alone() {
        let labels = jobset("ml/jobset/train/0");
        // Another gang, and a size that would block the restart, from the record: neither used.
        let m = membership(Some(&gang("ml/other", Some(64))), Some(&labels), Some("ml"));
        assert_eq!(m.gang, Some(gang("ml/jobset/train/0", None)));
        assert_eq!(m.notes.len(), 2, "{m:?}");
        assert!(m.notes[0].contains("labels (jobset)"), "{}", m.notes[0]);
        assert!(m.notes[1].contains("gang_size 64"), "{}", m.notes[1]);
        // The labels' own size stands (LeaderWorkerSet's size annotation).
        let lws = PodGang {
            id: "ml/lws/serve/0".into(),
            size: Some(4),
            source: "lws",
            attempt: None,
            jobset_uid: None,
        };
        let m = membership(Some(&gang("lws/serve/0", Some(4))), Some(&lws), Some("ml"));
        assert_eq!(m.gang, Some(gang("ml/lws/serve/0", Some(4))));
        assert!(m.notes.is_empty(), "the same gang and size: {m:?}");
        // A record naming nothing: the labels.
        let m = membership(None, Some(&labels), Some("ml"));
        assert_eq!(m.gang.unwrap().id, "ml/jobset/train/0");
    }

    #[test]
    fn without_tenancy_the_record_is_taken_as_written() {
        let m = membership(Some(&gang("run-7", Some(16))), None, None);
        assert_eq!(m.gang, Some(gang("run-7", Some(16))));
        assert!(m.notes.is_empty());
        // The label on Docker wins there too.
        let label = PodGang {
            id: "run-8".into(),
            size: None,
            source: "label",
            attempt: None,
            jobset_uid: None,
        };
        let m = membership(Some(&gang("run-7", None)), Some(&label), None);
        assert_eq!(m.gang.unwrap().id, "run-8");
        assert_eq!(membership(None, None, None), Membership::default());
    }

    #[test]
    fn a_scoped_id_past_the_rule_is_no_gang_and_says_so() {
        let long = "x".repeat(250);
        let m = membership(Some(&gang(&long, None)), None, Some("research"));
        assert_eq!(m.gang, None);
        assert!(m.unusable.unwrap().contains("past the 253"));
    }
}
