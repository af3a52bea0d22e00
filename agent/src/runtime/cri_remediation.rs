//! How a CRI container's hung worker is restarted: its pod and controllers read from the
//! Kubernetes API (`crate::kube::workloads`) into the table of `crate::vocab::workload`, with
//! `runtime.allow_pod_replacement` where the answer is a refusal it covers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::container::PodRef;
use super::Container;
use crate::kube::pods::{PodApi, PodError};
use crate::vocab::workload::{remediation, replaceable_on_request, Remediation, Stops, Workload};

/// How long a pod's read serves a gang member's entry (`Stops::EveryPod`, once a cycle while
/// its worker is in trouble): a hung 1,000-rank job would otherwise cost the API server three
/// GETs per rank per poll interval. The read right before a restart (`Stops::One`) is always
/// fresh.
const ENTRY_READ_TTL: Duration = Duration::from_secs(60);

/// What the CRI runtime's answer for a container rests on: the Kubernetes API its pod and
/// controllers are read on, the operator's override, and the pods read lately.
pub(super) struct Remedies {
    /// The Kubernetes API, for the pods and their controllers; `None` when it is off.
    pods: Option<Arc<dyn PodApi>>,
    /// `runtime.allow_pod_replacement`.
    allow: bool,
    /// Pods read for the members' entries, by `namespace/pod/uid/container`.
    reads: Mutex<HashMap<String, (Instant, Workload)>>,
}

impl Remedies {
    /// The answers on `pods` (none: the API is off), `allow` the operator's override.
    pub(super) fn new(pods: Option<Arc<dyn PodApi>>, allow: bool) -> Self {
        Remedies { pods, allow, reads: Mutex::default() }
    }

    /// The pod and its owners, read on the API (none: the API is off, an error): from a read
    /// younger than [`ENTRY_READ_TTL`] for an entry, fresh (and kept) otherwise. Errors are
    /// never kept. Kept by the sandbox's pod uid too: a pod created again under its name is
    /// read afresh.
    async fn workload(&self, p: &PodRef, stops: Stops) -> Result<Option<Workload>, PodError> {
        let api = self.pods.as_deref().ok_or(PodError::Unsupported("the Kubernetes API is off"))?;
        let key = format!("{}/{}/{}/{}", p.pod.namespace, p.pod.name, p.pod.uid, p.container);
        if stops == Stops::EveryPod {
            let kept = self.reads.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, w)) = kept.get(&key).filter(|(at, _)| at.elapsed() < ENTRY_READ_TTL) {
                return Ok(Some(w.clone()));
            }
        }
        let read = api.workload(&p.pod.namespace, &p.pod.name, &p.container).await?;
        let mut kept = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|_, (at, _)| at.elapsed() < ENTRY_READ_TTL);
        if let Some(w) = &read {
            kept.insert(key, (Instant::now(), w.clone()));
        }
        Ok(read)
    }

    /// The answer for `c`, stopping `stops` of its Job's pods.
    pub(super) async fn of(&self, c: &Container, stops: Stops) -> Remediation {
        let Some(p) = &c.pod else { return Remediation::IN_PLACE };
        let (pod, uid) = (format!("{}/{}", p.pod.namespace, p.pod.name), &p.pod.uid);
        // NB: the operator's override covers what it always covered — a pod that a stop ends
        // with nothing to bring it back (failed: nothing awaited), or whose controllers cannot
        // be read with the API off (stopped as ever, its next attempt awaited) — never a stop
        // the table found would fail a Job (no Job: nothing counts it), nor a pod whose read
        // failed on an API that is on (429, 500, a timeout, a missing rule): the next cycle
        // reads again, where a stop on a guess could spend a Job's backoffLimit unseen — and
        // whether a Job owns the pod is the read's to say (a Job with `manualSelector` labels
        // its pods with neither job label).
        match self.workload(p, stops).await {
            // NB: the pod of that name in the API is another incarnation (deleted and created
            // again: a LeaderWorkerSet's group, a StatefulSet's pod) while this container is the
            // old one's: the answer would be the new pod's controllers', for a container they
            // no longer own.
            Ok(Some(w)) if w.uid.as_ref().is_some_and(|u| !uid.is_empty() && u != uid) => {
                let api_uid = w.uid.as_deref().unwrap_or_default();
                let why = format!("pod {pod} in the API (uid {api_uid}) is not this container's pod (uid {uid}): it was created again under its name, and this container is the old pod's, its kubelet's to end");
                Remediation::Refuse(why)
            }
            Ok(Some(w)) => match remediation(&w, stops) {
                Remediation::Refuse(_) if self.allow && replaceable_on_request(&w) => {
                    let how = format!("runtime.allow_pod_replacement: pod {pod} is failed, and what follows is its controller's");
                    Remediation::Replace { how }
                }
                r => r,
            },
            Ok(None) => Remediation::Refuse(format!("pod {pod} is gone from the API")),
            // NB: a Job's pod is stopped by SIGKILL: a worker that exits 0 on SIGTERM would
            // read to its Job as a completed index.
            Err(e) if self.allow && self.pods.is_none() => {
                let how = format!("runtime.allow_pod_replacement: stopped although how pod {pod}'s controllers restart it is unknown ({e})");
                Remediation::InPlace { kill: p.job, how }
            }
            Err(e) if self.allow => Remediation::Refuse(format!(
                "how pod {pod}'s controllers restart it is unknown ({e}): refused until a read answers, since a stop on a guess could end the pod or spend a Job's backoffLimit unseen (runtime.allow_pod_replacement covers a pod only with the Kubernetes API off)"
            )),
            Err(e) => Remediation::Refuse(format!(
                "how pod {pod}'s controllers restart it is unknown ({e}): a stop could end the pod or fail its job; enable kubernetes.enabled (with the RBAC of deploy/base/rbac.yaml), or set runtime.allow_pod_replacement = true"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::pods::{NodePod, PodError};
    use crate::vocab::workload::RestartPolicy;

    /// An API that is on and answers every read with a 500.
    struct Failing;

    #[async_trait::async_trait]
    impl PodApi for Failing {
        async fn node_pods(&self, _: &str) -> Result<Vec<NodePod>, PodError> {
            Err(PodError::Unsupported("500 Internal Server Error"))
        }
        async fn workload(&self, _: &str, _: &str, _: &str) -> Result<Option<Workload>, PodError> {
            Err(PodError::Unsupported("500 Internal Server Error"))
        }
    }

    /// An API that reads the pod as `.0`.
    struct Serving(Workload);

    #[async_trait::async_trait]
    impl PodApi for Serving {
        async fn node_pods(&self, _: &str) -> Result<Vec<NodePod>, PodError> {
            Ok(Vec::new())
        }
        async fn workload(&self, _: &str, _: &str, _: &str) -> Result<Option<Workload>, PodError> {
            Ok(Some(self.0.clone()))
        }
    }

    /// The override replaces a `Never` pod nothing else replaces (row 11), and no other
    /// refusal: a failed device under an `Always` pod (row 0), a container whose own policy is
    /// `Never` (row 4), a controller the API does not have (row 1).
    #[tokio::test]
    async fn allow_pod_replacement_overrides_row_11_only() {
        let answer = |w: Workload| async move {
            let api = Remedies::new(Some(Arc::new(Serving(w))), true);
            api.of(&container(false), Stops::One).await
        };
        let never = Workload::bare("ml/train-0", "trainer", RestartPolicy::Never);
        assert!(matches!(answer(never.clone()).await, Remediation::Replace { .. }));
        let mut sick = Workload::bare("ml/train-0", "trainer", RestartPolicy::Always);
        sick.unhealthy = vec!["nvidia.com/gpu=GPU-0".into()];
        let mut own = Workload::bare("ml/train-0", "trainer", RestartPolicy::Always);
        own.container_policy = Some(RestartPolicy::Never);
        let mut missing = never.clone();
        missing.missing = Some("LeaderWorkerSet lws".into());
        // Row 0 under a Never pod: the worker's own Always restarts it in place (row 3), on a
        // device the kubelet reports unhealthy: refused, and no override fails the pod.
        let mut sick_never = never;
        sick_never.container_policy = Some(RestartPolicy::Always);
        sick_never.unhealthy = vec!["nvidia.com/gpu=GPU-0".into()];
        let cases =
            [(sick, "row 0"), (own, "row 4"), (missing, "row 1"), (sick_never, "row 0 (Never)")];
        for (w, row) in cases {
            let r = answer(w).await;
            assert!(matches!(r, Remediation::Refuse(_)), "{row}: {r:?}");
        }
    }

    /// The API's pod of that name created again (another uid) is not this container's: its
    /// controllers' answer is refused, never carried out on the old pod's container; the same
    /// uid (or a read that does not say) answers as the table does.
    #[tokio::test]
    async fn a_pod_created_again_under_its_name_answers_nothing_for_the_old_one() {
        let answer = |uid: Option<&str>| {
            let mut w = Workload::bare("ml/train-0", "trainer", RestartPolicy::Always);
            w.uid = uid.map(str::to_string);
            async move {
                let api = Remedies::new(Some(Arc::new(Serving(w))), true);
                api.of(&container(false), Stops::One).await
            }
        };
        let other = answer(Some("u-2")).await;
        assert!(
            matches!(&other, Remediation::Refuse(w) if w.contains("uid u-2") && w.contains("(uid u)")),
            "{other:?}"
        );
        for same in [Some("u"), None] {
            let r = answer(same).await;
            assert!(matches!(r, Remediation::InPlace { .. }), "{same:?}: {r:?}");
        }
        // Before the operator's override: a Never pod of another uid is refused, not failed.
        let mut never = Workload::bare("ml/train-0", "trainer", RestartPolicy::Never);
        never.uid = Some("u-2".into());
        let api = Remedies::new(Some(Arc::new(Serving(never))), true);
        let r = api.of(&container(false), Stops::One).await;
        assert!(matches!(&r, Remediation::Refuse(w) if w.contains("uid u-2")), "{r:?}");
    }

    /// An entry's read is kept by the sandbox's pod uid: the pod created again under its name
    /// (a new sandbox) is read afresh, never answered by the old pod's kept read.
    #[tokio::test]
    async fn a_kept_read_is_the_sandbox_s_pod_s_alone() {
        let serving = |uid: &str| -> Option<Arc<dyn PodApi>> {
            let mut w = Workload::bare("ml/train-0", "trainer", RestartPolicy::Always);
            w.uid = Some(uid.into());
            Some(Arc::new(Serving(w)))
        };
        let mut api = Remedies::new(serving("u"), false);
        let old = container(false);
        let r = api.of(&old, Stops::EveryPod).await;
        assert!(matches!(r, Remediation::InPlace { .. }), "{r:?}");
        let mut new = old.clone();
        new.pod.as_mut().unwrap().pod.uid = "u-2".into();
        api.pods = serving("u-2");
        let r = api.of(&new, Stops::EveryPod).await;
        assert!(matches!(r, Remediation::InPlace { .. }), "read afresh, not the old pod's: {r:?}");
    }

    fn container(job: bool) -> Container {
        crate::runtime::container::in_pod(job)
    }

    /// `allow_pod_replacement` stops a pod whose controllers cannot be read only where the API
    /// is off: on an API that fails, a stop could spend a Job's backoffLimit — a Job's pod
    /// by its labels or not (a `manualSelector` Job's pods carry neither job label).
    #[tokio::test]
    async fn a_job_s_pod_is_not_stopped_on_a_guess_while_the_api_fails() {
        let failing = Remedies::new(Some(Arc::new(Failing)), true);
        let job = failing.of(&container(true), Stops::One).await;
        assert!(
            matches!(&job, Remediation::Refuse(w) if w.contains("500") && w.contains("backoffLimit")),
            "{job:?}"
        );
        let unlabelled = failing.of(&container(false), Stops::One).await;
        assert!(
            matches!(&unlabelled, Remediation::Refuse(w) if w.contains("500") && w.contains("until a read answers")),
            "{unlabelled:?}"
        );
        let off = Remedies::new(None, true);
        let bare = off.of(&container(false), Stops::One).await;
        assert!(matches!(bare, Remediation::InPlace { kill: false, .. }), "the API off: {bare:?}");
        let off_job = off.of(&container(true), Stops::One).await;
        assert!(
            matches!(off_job, Remediation::InPlace { kill: true, .. }),
            "the API off: {off_job:?}"
        );
    }
}
