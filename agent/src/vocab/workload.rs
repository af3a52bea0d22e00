//! A worker's pod as its controllers define it — the pod's restart policy and its container's
//! restart rules, the Job that owns it, the JobSet or LeaderWorkerSet above — and how Vigil
//! restarts it the way those controllers restart it ([`remediation`]: one table, documented in
//! docs/controllers.md). Pure: `crate::kube::workloads` reads the facts, the restart path acts
//! on the answer.
//!
//! On Kubernetes a training job's restarts belong to its controller. A stop behind its back
//! spends a Job's `backoffLimit` unseen, ends a `Never` pod instead of restarting it, and fights a
//! JobSet that restarts the whole job anyway; so Vigil asks what a stop *does* under these
//! controllers before it stops anything, and refuses when the answer is "fail the job".

/// The exit code of a container stopped by SIGKILL (128 + 9): what a Job's pod failure policy
/// and a container's restart rules see when Vigil fails a pod.
pub const KILLED_EXIT: i32 = 137;

/// The keys the job controllers set on their pods (docs/research/gang-labels.md cites each):
/// what names a pod's gang (`crate::runtime::container::gang_of_pod`) and its owners
/// (`crate::kube::workloads`).
pub(crate) mod keys {
    pub(crate) const JOBSET_NAME: &str = "jobset.sigs.k8s.io/jobset-name";
    pub(crate) const JOBSET_RESTART: &str = "jobset.sigs.k8s.io/restart-attempt";
    pub(crate) const JOBSET_UID: &str = "jobset.sigs.k8s.io/jobset-uid";
    pub(crate) const REPLICATED_JOB: &str = "jobset.sigs.k8s.io/replicatedjob-name";
    pub(crate) const JOB_NAME: &str = "batch.kubernetes.io/job-name";
    pub(crate) const JOB_UID: &str = "batch.kubernetes.io/controller-uid";
    pub(crate) const JOB_INDEX: &str = "batch.kubernetes.io/job-completion-index";
    pub(crate) const LWS_NAME: &str = "leaderworkerset.sigs.k8s.io/name";
    pub(crate) const LWS_GROUP: &str = "leaderworkerset.sigs.k8s.io/group-index";
    pub(crate) const LWS_SIZE: &str = "leaderworkerset.sigs.k8s.io/size";
}

/// A pod's (or a container's own) `restartPolicy`; the API's default is `Always`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, strum::EnumString)]
pub enum RestartPolicy {
    #[default]
    #[strum(serialize = "Always", serialize = "")]
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The API's spelling; an empty or missing policy is the API default, `Always`.
    pub(crate) fn parse(s: Option<&str>) -> Option<RestartPolicy> {
        s.unwrap_or("Always").parse().ok()
    }
}

/// An exit-code requirement (`operator: In | NotIn`, `values`), as a Job's pod failure policy
/// and a container's restart rules both write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitCodes {
    pub within: bool,
    pub values: Vec<i32>,
}

impl ExitCodes {
    pub(crate) fn matches(&self, code: i32) -> bool {
        self.values.contains(&code) == self.within
    }
}

/// A container's restart rule (KEP-5307; `RestartAllContainers` from KEP-5532).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartRule {
    /// `Restart` (this container, in place) or `RestartAllContainers` (every container of the
    /// pod, in place, keeping its sandbox, IP and devices); any other action is not a restart.
    pub action: String,
    pub exit_codes: Option<ExitCodes>,
}

/// A rule of a Job's `podFailurePolicy` that looks at exit codes (a rule on pod conditions
/// matches a disruption, never a stop).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFailureRule {
    /// `FailJob`, `FailIndex`, `Ignore` or `Count`.
    pub action: String,
    /// The container the rule is about (`None`: any).
    pub container: Option<String>,
    pub exit_codes: ExitCodes,
}

/// The Job that owns the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFacts {
    pub name: String,
    /// `spec.backoffLimit` (the API's default is 6).
    pub backoff_limit: u32,
    /// `spec.parallelism` (default 1): how many of its pods a gang restart may stop.
    pub parallelism: u32,
    /// What its controller has counted against `backoffLimit` so far: failed pods, and the
    /// container restarts of its running `OnFailure` pods.
    pub retries: u32,
    pub pod_failure: Vec<PodFailureRule>,
    /// `spec.backoffLimitPerIndex`, when set: an index's own limit, whose count Vigil does not
    /// read (so a stop of such a Job's pod is refused rather than guessed).
    pub per_index: Option<u32>,
}

/// A rule of a JobSet's `failurePolicy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureRule {
    pub name: String,
    /// `FailJobSet`, `RestartJobSet` or `RestartJobSetAndIgnoreMaxRestarts`.
    pub action: String,
    /// The child Job failure reasons it matches (empty: any).
    pub reasons: Vec<String>,
    /// The replicated jobs it is about (empty: all).
    pub targets: Vec<String>,
    /// `onJobFailureMessagePatterns`: it matches the failure's message too, which Vigil cannot
    /// know before the failure (such a rule that could match makes the answer unknown).
    pub on_message: bool,
}

/// The JobSet above the Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSetFacts {
    /// `namespace/name`.
    pub name: String,
    /// The replicated job the pod's Job belongs to.
    pub replicated_job: String,
    /// `spec.failurePolicy`: `None` when it has none (a failed child Job fails the JobSet).
    pub max_restarts: Option<u32>,
    pub rules: Vec<FailureRule>,
    /// `status.restartsCountTowardsMax` (absent: 0 where a rule restarts without counting,
    /// else `status.restarts`): restarts spent against `maxRestarts`.
    pub restarts: u32,
    /// `spec.failurePolicy.restartStrategy` (`Recreate` where unset): `InPlaceRestart` has
    /// JobSet's own agent restart the pods in place, and Vigil leaves it to it.
    pub strategy: String,
}

/// The LeaderWorkerSet the pod is a member of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LwsFacts {
    /// `namespace/name`.
    pub name: String,
    /// The pod's group (`leaderworkerset.sigs.k8s.io/group-index`).
    pub group: String,
    /// `spec.leaderWorkerTemplate.restartPolicy` recreates the group when one of its pods
    /// restarts: `RecreateGroupOnPodRestart` (the default) or `RecreateGroupAfterStart`.
    pub recreate_group: bool,
}

/// The worker's pod and what owns it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// The pod's uid as its kubelet knows it (`metadata.uid`; a static pod's, for its mirror
    /// pod); `None` where the read does not say.
    pub uid: Option<String>,
    pub policy: RestartPolicy,
    /// The worker container's own `restartPolicy` (KEP-5307: it overrides the pod's).
    pub container_policy: Option<RestartPolicy>,
    /// The worker container's restart rules, in order.
    pub rules: Vec<RestartRule>,
    pub container: String,
    pub job: Option<JobFacts>,
    pub jobset: Option<JobSetFacts>,
    pub lws: Option<LwsFacts>,
    /// An owner the pod names that the API does not have (a Job's JobSet, the LeaderWorkerSet
    /// its labels name): how its controller restarts it is unknown.
    pub missing: Option<String>,
    /// The worker container's allocated devices the kubelet reports `Unhealthy`
    /// (`allocatedResourcesStatus`, KEP-4680), as `<resource> <device id>`: a restart on them
    /// cannot help.
    pub unhealthy: Vec<String>,
}

impl Workload {
    /// A pod known by its restart policy only (no owner read).
    pub fn bare(pod: &str, container: &str, policy: RestartPolicy) -> Workload {
        Workload { pod: pod.into(), policy, container: container.into(), ..Default::default() }
    }
}

/// How many pods of a Job the restart being judged may stop: a gang's decision stops every
/// member (`EveryPod`: room for each pod of the Job), a worker's pass stops its own (`One`: a
/// gang's members are each asked again as they carry out a decision that reserved the room).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stops {
    One,
    EveryPod,
}

/// How a hung worker of this pod is restarted, the way its controllers restart it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remediation {
    /// The stopped container is started again in place by the kubelet (its next attempt is
    /// awaited). `kill`: the stop is a SIGKILL (exit 137), so that a restart rule matches it or
    /// a Job never reads a polite exit 0 as a success.
    InPlace { kill: bool, how: String },
    /// The pod is failed (every container SIGKILLed, the worker's exit 137) and its Job replaces
    /// it: each member of a gang is failed and replaced (each counted against `backoffLimit`).
    Replace { how: String },
    /// One member's stop makes the controller restart every member (a JobSet recreates its
    /// Jobs; a LeaderWorkerSet recreates the group): one member only, never N stops, nothing
    /// awaited after it. `kill`: the pod is failed by SIGKILL (a Job's pod); else the worker is
    /// stopped as usual. `whole`: what restarts (`jobset:<ns>/<name>`,
    /// `lws:<ns>/<name>/<group>`): a gang's members must all name the same.
    OneForAll { kill: bool, how: String, whole: String },
    /// No stop restarts it without failing the job, or what a stop would do is unknown: Vigil
    /// does not act (and says why).
    Refuse(String),
}

impl Remediation {
    /// Restarted in place after a polite stop, and nothing more to say: a runtime without pods.
    pub const IN_PLACE: Remediation = Remediation::InPlace { kill: false, how: String::new() };

    /// The stop is a SIGKILL at once (no stop grace).
    pub fn kills(&self) -> bool {
        match self {
            Remediation::InPlace { kill, .. } | Remediation::OneForAll { kill, .. } => *kill,
            Remediation::Replace { .. } => true,
            Remediation::Refuse(_) => false,
        }
    }

    /// The kubelet starts the container's next attempt in the same pod, and the restart is
    /// verified by it. Otherwise the controller makes the next incarnation (a new pod, a new
    /// group): nothing is awaited, the restart is done once the stopped container is.
    pub fn restarted_in_place(&self) -> bool {
        matches!(self, Remediation::InPlace { .. })
    }

    /// The whole pod is failed (every container stopped), not only the worker's: a `Never`
    /// pod fails only once all its containers have ended.
    pub fn fails_pod(&self) -> bool {
        matches!(self, Remediation::Replace { .. } | Remediation::OneForAll { kill: true, .. })
    }

    /// What the trail and the pages say of it.
    pub fn how(&self) -> &str {
        match self {
            Remediation::InPlace { how, .. }
            | Remediation::Replace { how }
            | Remediation::OneForAll { how, .. }
            | Remediation::Refuse(how) => how,
        }
    }
}

/// The one table: how a hung worker of `w` is restarted, stopping `stops` of its Job's pods
/// (docs/controllers.md, in this order):
///
/// 0. a device of the worker the kubelet reports `Unhealthy`, and a restart in place: refused (a
///    failed GPU; a pod replaced gets another device);
/// 1. an owner the pod names that the API does not have: refused (unknown);
/// 2. a LeaderWorkerSet that recreates its group on a pod restart: one member, the group follows;
/// 3. a container restart rule that matches a SIGKILL (exit 137), or the container's own
///    `Always`/`OnFailure` in a `Never` pod: a kill, restarted in place — the pod does not fail
///    (under an `OnFailure` Job's pod the restart is counted: row 5 decides);
/// 4. the container's own `Never` in a pod that would restart it: refused (a stop ends it);
/// 5. a pod of a Job: a stop counts against `backoffLimit` (a failed `Never` pod, an `OnFailure`
///    container's restart). Within it: in place (`OnFailure`) or replaced (`Never`), by a kill.
///    When a stop would fail the Job: one member, if its JobSet's failure policy restarts the
///    JobSet on that failure; else refused. Refused too: a gang's stop of every pod that would
///    fail the Job partway (one pod's would not), and a pod failure policy rule on another
///    container that a kill may match;
/// 6. `Always` (or `OnFailure` outside a Job): in place, as always (`OnFailure` by a kill: an
///    exit 0 would not be restarted);
/// 7. `Never` with no controller that brings it back: refused.
pub fn remediation(w: &Workload, stops: Stops) -> Remediation {
    let r = by_controllers(w, stops);
    // NB: only a restart in place keeps the device: a pod failed for its controller is
    // replaced, and a new pod is not given a device its kubelet reports unhealthy.
    if !w.unhealthy.is_empty() && r.restarted_in_place() {
        let devices = w.unhealthy.join(", ");
        return Remediation::Refuse(format!(
            "the kubelet reports its device(s) {devices} Unhealthy (allocatedResourcesStatus): a restart in place on a failed device cannot help; the device must be fixed or the pod placed elsewhere"
        ));
    }
    r
}

/// Row 11, the one refusal `runtime.allow_pod_replacement` overrides: a `Never` pod that no
/// controller replaces (a stop ends it; the operator asked for that). Never a Job's pod, a
/// controller the API does not have (row 1), or a container whose own policy refuses (row 4).
pub fn replaceable_on_request(w: &Workload) -> bool {
    w.policy == RestartPolicy::Never
        && w.job.is_none()
        && w.missing.is_none()
        && in_place_uncounted(w).is_none()
}

/// The table without the kubelet's device health (rows 1–11).
fn by_controllers(w: &Workload, stops: Stops) -> Remediation {
    let Workload { pod, container, policy, container_policy, job, lws, missing, .. } = w;
    if let Some(what) = missing {
        return Remediation::Refuse(format!(
            "pod {pod} names {what}, which the API does not have: how its controller restarts it is unknown"
        ));
    }
    if let Some(LwsFacts { name, group, .. }) = lws.as_ref().filter(|l| l.recreate_group) {
        return Remediation::OneForAll {
            kill: false,
            how: format!("LeaderWorkerSet {name} recreates the whole group when one of its pods restarts: one member is stopped, the group follows"),
            whole: format!("lws:{name}/{group}"),
        };
    }
    let counted = job.is_some() && *policy == RestartPolicy::OnFailure;
    if let Some(why) = in_place_uncounted(w).filter(|_| !counted) {
        return Remediation::InPlace {
            kill: true,
            how: format!("container {container} of pod {pod} {why}: it is stopped with SIGKILL and restarted in place (the pod does not fail)"),
        };
    }
    if *container_policy == Some(RestartPolicy::Never) && *policy != RestartPolicy::Never {
        return Remediation::Refuse(format!(
            "container {container} of pod {pod} has restartPolicy Never of its own: a stop ends it, nothing restarts it"
        ));
    }
    match (job, *policy) {
        (Some(job), RestartPolicy::OnFailure | RestartPolicy::Never) => of_job(w, job, stops),
        (_, RestartPolicy::Always | RestartPolicy::OnFailure) => in_place(w),
        (_, RestartPolicy::Never) => Remediation::Refuse(format!(
            "pod {pod} has restartPolicy Never and no controller that replaces it: stopping its container would end the pod, not restart it (set runtime.allow_pod_replacement = true to allow it)"
        )),
    }
}

/// Row 6: restarted in place by the kubelet. Under `OnFailure` (the pod's, or the container's
/// own) by a kill: a worker that exits 0 at SIGTERM (a polite trainer's handler) has succeeded
/// in the kubelet's eyes, and its container would never come back.
fn in_place(w: &Workload) -> Remediation {
    let Workload { pod, container, policy, container_policy, .. } = w;
    let kill = container_policy.unwrap_or(*policy) == RestartPolicy::OnFailure;
    let how = match kill {
        true => format!("container {container} of pod {pod} (restartPolicy OnFailure) is stopped with SIGKILL and restarted in place by the kubelet: an exit 0 at SIGTERM would be a success, never restarted"),
        false => format!("pod {pod} is restarted in place by the kubelet"),
    };
    Remediation::InPlace { kill, how }
}

/// Why the kubelet restarts the worker container in place after a SIGKILL without the pod
/// failing: a restart rule on exit 137, or its own `Always`/`OnFailure` in a `Never` pod.
fn in_place_uncounted(w: &Workload) -> Option<String> {
    if let Some(rule) = restart_rule(w) {
        return Some(format!("has the restart rule {} on exit code {KILLED_EXIT}", rule.action));
    }
    match (w.policy, w.container_policy) {
        (RestartPolicy::Never, Some(own @ (RestartPolicy::Always | RestartPolicy::OnFailure))) => {
            Some(format!("has restartPolicy {own:?} of its own"))
        }
        _ => None,
    }
}

/// The worker container's restart rule for a SIGKILL's exit code, when it restarts in place:
/// the first rule whose exit codes match decides (none: the container's `restartPolicy`).
fn restart_rule(w: &Workload) -> Option<&RestartRule> {
    w.rules
        .iter()
        .find(|r| r.exit_codes.as_ref().is_some_and(|e| e.matches(KILLED_EXIT)))
        .filter(|r| matches!(r.action.as_str(), "Restart" | "RestartAllContainers"))
}

/// A pod of a Job: within `backoffLimit`, each pod once; past it, the JobSet's restart or none.
fn of_job(w: &Workload, job: &JobFacts, stops: Stops) -> Remediation {
    let JobFacts { name: job_name, backoff_limit, retries, per_index, .. } = job;
    if let Some(refused) = other_container_rule(w, job) {
        return refused;
    }
    let reason = match failure_rule(w, job) {
        // An ignored failure is not counted: the pod is replaced, whatever the count.
        Some(r) if r.action == "Ignore" => {
            return Remediation::Replace { how: format!(
                "Job {job_name}'s pod failure policy ignores exit code {KILLED_EXIT}: the pod is failed (SIGKILL) and the Job replaces it, uncounted"
            ) };
        }
        Some(r) if r.action == "FailJob" => Some("PodFailurePolicy"),
        Some(r) if r.action == "FailIndex" => {
            return Remediation::Refuse(format!(
                "Job {job_name}'s pod failure policy answers FailIndex to exit code {KILLED_EXIT}: the index would be failed, not restarted"
            ));
        }
        _ => None,
    };
    if let Some(limit) = per_index {
        return Remediation::Refuse(format!(
            "Job {job_name} limits retries per index (backoffLimitPerIndex {limit}), which Vigil does not count: a stop could fail the index"
        ));
    }
    if let Some(r) = room(w, job, stops).filter(|_| reason.is_none()) {
        return r;
    }
    let reason = reason.unwrap_or("BackoffLimitExceeded");
    let fails = format!(
        "a stop fails Job {job_name} ({reason}: backoffLimit {backoff_limit}, {retries} used)"
    );
    let Some(js) = &w.jobset else {
        return Remediation::Refuse(format!(
            "{fails}, and no JobSet restarts it: its controller decides"
        ));
    };
    match jobset_restarts(js, reason) {
        Ok(why) => Remediation::OneForAll {
            kill: true,
            how: format!("{fails}; {why}: one member is failed, the JobSet recreates every Job"),
            whole: format!("jobset:{}", js.name),
        },
        Err(why) => Remediation::Refuse(format!("{fails}, and {why}")),
    }
}

/// The answer while the stops fit within the Job's `backoffLimit` ([`within_limit`]), or a
/// refusal where every pod's would not but one pod's would. NB: then one member's stop does not
/// fail the Job, so no JobSet restart follows it, and stopping them all fails it partway.
fn room(w: &Workload, job: &JobFacts, stops: Stops) -> Option<Remediation> {
    if let Some(r) = within_limit(w, job, stops) {
        return Some(r);
    }
    let JobFacts { name, backoff_limit, retries, parallelism, .. } = job;
    (stops == Stops::EveryPod && within_limit(w, job, Stops::One).is_some()).then(|| {
        Remediation::Refuse(format!(
            "stopping every pod of Job {name} would fail it partway (backoffLimit {backoff_limit}, {retries} used, parallelism {parallelism}), and one pod's stop does not fail it: no one stop restarts the whole; its controller decides"
        ))
    })
}

/// While every pod of the Job can be stopped once within its `backoffLimit`: in place
/// (`OnFailure`) or replaced (`Never`), counted. The Job controller fails a `Never` Job when its
/// failed pods exceed the limit, an `OnFailure` one when its pods' container restarts reach it
/// (exceed it, at 0).
fn within_limit(w: &Workload, job: &JobFacts, stops: Stops) -> Option<Remediation> {
    let n = match stops {
        Stops::One => 1,
        Stops::EveryPod => job.parallelism.max(1),
    };
    let after = job.retries.saturating_add(n);
    let within = match w.policy {
        RestartPolicy::OnFailure => after < job.backoff_limit,
        _ => after <= job.backoff_limit,
    };
    if !within {
        return None;
    }
    let JobFacts { name: job_name, backoff_limit, retries, .. } = job;
    let counted = format!("counted against Job {job_name}'s backoffLimit: {retries} of {backoff_limit} used, {n} pod(s) at most this time");
    Some(match w.policy {
        RestartPolicy::OnFailure => Remediation::InPlace {
            kill: true,
            how: format!("pod {} (OnFailure) is restarted in place, {counted}", w.pod),
        },
        _ => Remediation::Replace {
            how: format!("pod {} (Never) is failed and replaced by its Job, {counted}", w.pod),
        },
    })
}

/// The first rule of the Job's pod failure policy that a SIGKILL of the worker container
/// matches.
fn failure_rule<'a>(w: &Workload, job: &'a JobFacts) -> Option<&'a PodFailureRule> {
    job.pod_failure.iter().find(|r| {
        r.container.as_deref().is_none_or(|c| c == w.container) && r.exit_codes.matches(KILLED_EXIT)
    })
}

/// The refusal where a rule of the Job's pod failure policy is about another of the pod's
/// containers and a SIGKILL would match it. NB: Vigil fails a Job's pod whole (a pod failure policy needs
/// `restartPolicy: Never`): a sidecar or data loader it stops exits 137 too, and its rule may
/// fail the Job; but an init container that finished (exit 0, skipped) or one that ended on its
/// own keeps its code, which Vigil does not read: what the rule does is unknown.
fn other_container_rule(w: &Workload, job: &JobFacts) -> Option<Remediation> {
    let r = job.pod_failure.iter().find(|r| {
        r.container.as_deref().is_some_and(|c| c != w.container)
            && r.exit_codes.matches(KILLED_EXIT)
    })?;
    let container = r.container.as_deref().unwrap_or_default();
    Some(Remediation::Refuse(format!(
        "Job {}'s pod failure policy has a {} rule on container {container}, which a stop of the whole pod may or may not match (its exit code is unknown): its controller decides",
        job.name, r.action
    )))
}

/// Whether the JobSet restarts when its Job fails for `reason`, as its failure policy reads:
/// the first rule that matches the reason and the replicated job decides; none matching is a
/// restart counted against `maxRestarts`; no failure policy fails the JobSet. Why, in words:
/// `Ok` when it restarts (recreates every Job), `Err` when it does not (it fails, its restarts
/// are spent, or what it does is unknown).
pub(crate) fn jobset_restarts(js: &JobSetFacts, reason: &str) -> Result<String, String> {
    let JobSetFacts { name: jobset_name, replicated_job, max_restarts, rules, restarts, strategy } =
        js;
    let Some(max) = max_restarts else {
        return Err(format!(
            "JobSet {jobset_name} has no failurePolicy: a failed Job fails the JobSet"
        ));
    };
    if strategy == "InPlaceRestart" {
        return Err(format!(
            "JobSet {jobset_name} restarts in place with its own agent (restartStrategy InPlaceRestart): Vigil leaves the restart to it"
        ));
    }
    let rule = rules.iter().find(|r| {
        (r.reasons.is_empty() || r.reasons.iter().any(|x| x == reason))
            && (r.targets.is_empty() || r.targets.contains(replicated_job))
    });
    if let Some(FailureRule { name: rule_name, .. }) = rule.filter(|r| r.on_message) {
        return Err(format!(
            "JobSet {jobset_name}'s failure policy rule {rule_name} also matches the failure's message, which is not known before the failure: what it does is unknown"
        ));
    }
    let rule_note = rule.filter(|r| !r.name.is_empty()).map(|r| format!(" (rule {})", r.name));
    let rule_note = rule_note.unwrap_or_default();
    match rule.map(|r| r.action.as_str()) {
        Some("RestartJobSetAndIgnoreMaxRestarts") => Ok(format!(
            "JobSet {jobset_name} restarts on it{rule_note}, whatever its restarts"
        )),
        Some("RestartJobSet") | None if restarts < max => Ok(format!(
            "JobSet {jobset_name} restarts on it (restart {} of maxRestarts {max})",
            restarts + 1
        )),
        Some("RestartJobSet") | None => Err(format!(
            "JobSet {jobset_name}'s restarts are spent ({restarts} of maxRestarts {max}): the next failure fails the JobSet"
        )),
        // FailJobSet; and RestartJob (alpha), which recreates the failed Job alone while the
        // other Jobs' ranks stay hung.
        Some(action) => Err(format!(
            "JobSet {jobset_name}'s failure policy answers {action}{rule_note} to {reason}"
        )),
    }
}

#[cfg(test)]
#[path = "workload_tests.rs"]
mod tests;
