//! How a CRI container's hung worker is restarted: its pod and controllers read from the
//! Kubernetes API (`crate::kube::workloads`) into the table of `crate::vocab::workload`, with
//! `runtime.allow_pod_replacement` where the answer is a refusal it covers.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::Container;
use crate::kube::pods::{PodApi, PodError};
use crate::vocab::workload::{remediation, Remediation, Stops, Workload};

/// How long a pod's read serves a gang member's entry (`Stops::EveryPod`, once a cycle while
/// its worker is in trouble): a hung 1,000-rank job would otherwise cost the API server three
/// GETs per rank per poll interval. The read right before a restart (`Stops::One`) is always
/// fresh.
const ENTRY_READ_TTL: Duration = Duration::from_secs(60);

/// Pods read for the members' entries, by `namespace/pod/container`.
#[derive(Default)]
pub(super) struct Reads(Mutex<HashMap<String, (Instant, Workload)>>);

impl Reads {
    /// The pod and its owners: from a read younger than [`ENTRY_READ_TTL`] for an entry, fresh
    /// (and kept) otherwise. Errors are never kept.
    async fn workload(
        &self,
        api: &dyn PodApi,
        c: (&str, &str, &str),
        stops: Stops,
    ) -> Result<Option<Workload>, PodError> {
        let key = format!("{}/{}/{}", c.0, c.1, c.2);
        if stops == Stops::EveryPod {
            let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, w)) = kept
                .get(&key)
                .filter(|(at, _)| at.elapsed() < ENTRY_READ_TTL)
            {
                return Ok(Some(w.clone()));
            }
        }
        let read = api.workload(c.0, c.1, c.2).await?;
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|_, (at, _)| at.elapsed() < ENTRY_READ_TTL);
        if let Some(w) = &read {
            kept.insert(key, (Instant::now(), w.clone()));
        }
        Ok(read)
    }
}

/// The answer for `c`, stopping `stops` of its Job's pods; `pods` the API (none: off), `allow`
/// `runtime.allow_pod_replacement`, `reads` the pods read lately.
pub(super) async fn of(
    pods: Option<&dyn PodApi>,
    reads: &Reads,
    allow: bool,
    c: &Container,
    stops: Stops,
) -> Remediation {
    let Some(p) = &c.pod else {
        return Remediation::InPlace {
            kill: false,
            how: String::new(),
        };
    };
    let pod = format!("{}/{}", p.namespace, p.pod);
    let read = match &pods {
        Some(api) => {
            let which = (p.namespace.as_str(), p.pod.as_str(), p.container.as_str());
            reads.workload(*api, which, stops).await
        }
        None => Err(crate::kube::pods::PodError::Unsupported(
            "the Kubernetes API is off",
        )),
    };
    // NB: the operator's override covers what it always covered — a pod that a stop ends
    // with nothing to bring it back (failed: nothing awaited), or whose controllers cannot
    // be read (stopped as ever, its next attempt awaited) — never a stop the table found
    // would fail a Job (no Job: nothing counts it).
    match read {
        Ok(Some(w)) => match remediation(&w, stops) {
            Remediation::Refuse(_) if allow && w.job.is_none() => Remediation::Replace {
                how: format!(
                    "runtime.allow_pod_replacement: pod {pod} is failed, and what follows is its controller's"
                ),
            },
            r => r,
        },
        Ok(None) => Remediation::Refuse(format!("pod {pod} is gone from the API")),
        // NB: a Job's pod is stopped by SIGKILL: a worker that exits 0 on SIGTERM would
        // read to its Job as a completed index.
        Err(e) if allow => Remediation::InPlace {
            kill: p.job,
            how: format!(
                "runtime.allow_pod_replacement: stopped although how pod {pod}'s controllers restart it is unknown ({e})"
            ),
        },
        Err(e) => Remediation::Refuse(format!(
            "how pod {pod}'s controllers restart it is unknown ({e}): a stop could end the pod or fail its job; enable kubernetes.enabled (with the RBAC of deploy/base/rbac.yaml), or set runtime.allow_pod_replacement = true"
        )),
    }
}
