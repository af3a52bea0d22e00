//! How a CRI container's hung worker is restarted: its pod and controllers read from the
//! Kubernetes API (`crate::kube::workloads`) into the table of `crate::vocab::workload`, with
//! `runtime.allow_pod_replacement` where the answer is a refusal it covers.

use super::Container;
use crate::kube::pods::PodApi;
use crate::vocab::workload::{remediation, Remediation, Stops};

/// The answer for `c`, stopping `stops` of its Job's pods; `pods` the API (none: off), `allow`
/// `runtime.allow_pod_replacement`.
pub(super) async fn of(
    pods: Option<&dyn PodApi>,
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
        Some(api) => api.workload(&p.namespace, &p.pod, &p.container).await,
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
