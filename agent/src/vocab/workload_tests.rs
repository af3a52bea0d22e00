use super::*;

fn rem(w: &Workload) -> Remediation {
    remediation(w, Stops::EveryPod)
}

fn pod(policy: RestartPolicy) -> Workload {
    Workload::bare("ml/train-0", "trainer", policy)
}

fn job(backoff_limit: u32, retries: u32, parallelism: u32) -> JobFacts {
    JobFacts {
        name: "train-workers-0".into(),
        backoff_limit,
        parallelism,
        retries,
        pod_failure: Vec::new(),
        per_index: None,
    }
}

fn jobset(max_restarts: Option<u32>, restarts: u32) -> JobSetFacts {
    JobSetFacts {
        name: "train".into(),
        replicated_job: "workers".into(),
        max_restarts,
        rules: Vec::new(),
        restarts,
        strategy: "Recreate".into(),
    }
}

fn rule(action: &str, reasons: &[&str], targets: &[&str]) -> FailureRule {
    FailureRule {
        name: "r".into(),
        action: action.into(),
        reasons: reasons.iter().map(|s| s.to_string()).collect(),
        targets: targets.iter().map(|s| s.to_string()).collect(),
        on_message: false,
    }
}

fn codes(within: bool, values: &[i32]) -> ExitCodes {
    ExitCodes { within, values: values.to_vec() }
}

/// The common JobSet shape: Never pods, `backoffLimit: 0`, a failure policy with restarts left.
fn jobset_never(max: Option<u32>, restarts: u32) -> Workload {
    Workload {
        job: Some(job(0, 0, 4)),
        jobset: Some(jobset(max, restarts)),
        ..pod(RestartPolicy::Never)
    }
}

fn kind(r: &Remediation) -> &'static str {
    match r {
        Remediation::InPlace { kill: false, .. } => "in-place",
        Remediation::InPlace { kill: true, .. } => "in-place-kill",
        Remediation::Replace { .. } => "replace",
        Remediation::OneForAll { kill: false, .. } => "one-for-all",
        Remediation::OneForAll { kill: true, .. } => "one-for-all-kill",
        Remediation::Refuse(_) => "refuse",
    }
}

#[test]
fn plain_pods_are_restarted_in_place_and_never_pods_refused() {
    assert_eq!(kind(&rem(&pod(RestartPolicy::Always))), "in-place");
    // OnFailure by a kill: a worker that exits 0 at SIGTERM would never be restarted.
    assert_eq!(kind(&rem(&pod(RestartPolicy::OnFailure))), "in-place-kill");
    let mut own = pod(RestartPolicy::Always);
    own.container_policy = Some(RestartPolicy::OnFailure);
    assert_eq!(kind(&rem(&own)), "in-place-kill", "the container's own policy");
    assert_eq!(kind(&rem(&pod(RestartPolicy::Always))), "in-place");
    own.policy = RestartPolicy::OnFailure;
    own.container_policy = Some(RestartPolicy::Always);
    assert_eq!(kind(&rem(&own)), "in-place", "Always of its own in an OnFailure pod");
    let r = rem(&pod(RestartPolicy::Never));
    assert_eq!(kind(&r), "refuse");
    assert!(r.how().contains("restartPolicy Never"), "{}", r.how());
}

#[test]
fn the_common_jobset_shape_fails_one_member_and_the_jobset_restarts() {
    let r = rem(&jobset_never(Some(3), 1));
    assert_eq!(kind(&r), "one-for-all-kill", "{}", r.how());
    assert!(r.how().contains("restart 2 of maxRestarts 3"), "{}", r.how());
    assert!(r.kills() && r.fails_pod() && !r.restarted_in_place());
}

#[test]
fn a_jobset_whose_restarts_are_spent_or_that_has_no_policy_is_refused() {
    let spent = rem(&jobset_never(Some(3), 3));
    assert_eq!(kind(&spent), "refuse");
    assert!(spent.how().contains("spent (3 of maxRestarts 3)"), "{}", spent.how());
    let none = rem(&jobset_never(None, 0));
    assert_eq!(kind(&none), "refuse");
    assert!(none.how().contains("no failurePolicy"), "{}", none.how());
}

#[test]
fn the_jobsets_rules_are_read_in_order_first_match_wins() {
    let with = |rules: Vec<FailureRule>, restarts| {
        let mut w = jobset_never(Some(2), restarts);
        w.jobset.as_mut().unwrap().rules = rules;
        rem(&w)
    };
    // FailJobSet on BackoffLimitExceeded: refused, named.
    let r = with(vec![rule("FailJobSet", &["BackoffLimitExceeded"], &[])], 0);
    assert_eq!(kind(&r), "refuse");
    assert!(r.how().contains("answers FailJobSet (rule r)"), "{}", r.how());
    // A rule about another replicated job or reason does not match: the default restart.
    let r = with(
        vec![
            rule("FailJobSet", &["BackoffLimitExceeded"], &["driver"]),
            rule("FailJobSet", &["DeadlineExceeded"], &[]),
        ],
        0,
    );
    assert_eq!(kind(&r), "one-for-all-kill", "{}", r.how());
    // The first matching rule decides, even with a FailJobSet after it.
    let r = with(
        vec![
            rule("RestartJobSetAndIgnoreMaxRestarts", &[], &["workers"]),
            rule("FailJobSet", &[], &[]),
        ],
        2,
    );
    assert_eq!(kind(&r), "one-for-all-kill", "ignores maxRestarts: {}", r.how());
    // RestartJobSet counts against maxRestarts.
    let r = with(vec![rule("RestartJobSet", &[], &[])], 2);
    assert_eq!(kind(&r), "refuse");
}

#[test]
fn a_pod_failure_policy_changes_what_a_kill_does() {
    let with = |action: &str, container: Option<&str>, exit: ExitCodes| {
        let mut w = jobset_never(Some(3), 0);
        w.job.as_mut().unwrap().backoff_limit = 6;
        w.job.as_mut().unwrap().pod_failure = vec![PodFailureRule {
            action: action.into(),
            container: container.map(str::to_string),
            exit_codes: exit,
        }];
        rem(&w)
    };
    // FailJob on 137: the Job fails at once (PodFailurePolicy), whatever its backoffLimit.
    let r = with("FailJob", None, codes(true, &[137]));
    assert_eq!(kind(&r), "one-for-all-kill", "{}", r.how());
    assert!(r.how().contains("PodFailurePolicy"), "{}", r.how());
    // Ignore on 137: replaced, uncounted.
    assert_eq!(kind(&with("Ignore", None, codes(true, &[137]))), "replace");
    // A rule about another container that a kill may match: the pod is failed whole, but
    // whether that container exits 137 (a sidecar) or keeps its own code (an init container
    // that finished) is unknown: refused, whatever the rule says (an Ignore as a FailJob).
    for action in ["FailJob", "Ignore"] {
        let other = with(action, Some("loader"), codes(true, &[137]));
        assert_eq!(kind(&other), "refuse", "{action}: {}", other.how());
        assert!(other.how().contains("container loader"), "{}", other.how());
    }
    // One about another container that a kill cannot match: as if absent, counted.
    assert_eq!(kind(&with("FailJob", Some("loader"), codes(true, &[1]))), "replace");
    // A FailJob reason goes to the JobSet even where every pod would fit in the limit.
    let mut w = jobset_never(Some(3), 0);
    w.job.as_mut().unwrap().backoff_limit = 4;
    w.job.as_mut().unwrap().pod_failure = vec![PodFailureRule {
        action: "FailJob".into(),
        container: None,
        exit_codes: codes(true, &[137]),
    }];
    assert_eq!(kind(&rem(&w)), "one-for-all-kill", "{}", rem(&w).how());
    // Codes that exclude 137 do not match: counted.
    assert_eq!(kind(&with("FailJob", None, codes(false, &[137]))), "replace");
    assert_eq!(kind(&with("FailJob", None, codes(false, &[1]))), "one-for-all-kill");
}

#[test]
fn a_jobs_backoff_limit_is_never_spent_unseen() {
    let on_failure = |limit, retries, parallelism| {
        rem(&Workload {
            job: Some(job(limit, retries, parallelism)),
            ..pod(RestartPolicy::OnFailure)
        })
    };
    // Room for every pod of the Job once: in place, by a kill (no polite exit 0 read as done).
    let r = on_failure(6, 1, 4);
    assert_eq!(kind(&r), "in-place-kill", "{}", r.how());
    assert!(r.how().contains("1 of 6 used"), "{}", r.how());
    // No room for every pod, room for one: refused (stopping them all fails it partway).
    let r = on_failure(6, 3, 4);
    assert_eq!(kind(&r), "refuse");
    assert!(r.how().contains("partway"), "{}", r.how());
    // No room for one, and no JobSet: refused (the stop would fail the Job).
    let r = on_failure(6, 5, 4);
    assert_eq!(kind(&r), "refuse");
    assert!(r.how().contains("BackoffLimitExceeded"), "{}", r.how());
    assert_eq!(kind(&on_failure(0, 0, 1)), "refuse");
    // backoffLimit 0 OnFailure in a JobSet that restarts: the same single path as Never.
    let r = rem(&Workload {
        job: Some(job(0, 0, 2)),
        jobset: Some(jobset(Some(1), 0)),
        ..pod(RestartPolicy::OnFailure)
    });
    assert_eq!(kind(&r), "one-for-all-kill", "{}", r.how());
    // Never pods of a Job with room: each one failed and replaced by the Job.
    let r = rem(&Workload { job: Some(job(8, 0, 4)), ..pod(RestartPolicy::Never) });
    assert_eq!(kind(&r), "replace", "{}", r.how());
    assert!(r.fails_pod() && !r.restarted_in_place());
}

#[test]
fn jobsets_own_in_place_agent_and_its_single_job_restarts_are_left_to_it() {
    let mut w = jobset_never(Some(3), 0);
    w.jobset.as_mut().unwrap().strategy = "InPlaceRestart".into();
    let r = rem(&w);
    assert_eq!(kind(&r), "refuse");
    assert!(r.how().contains("InPlaceRestart"), "{}", r.how());
    let mut w = jobset_never(Some(3), 0);
    w.jobset.as_mut().unwrap().rules = vec![rule("RestartJob", &[], &[])];
    assert_eq!(kind(&rem(&w)), "refuse");
}

#[test]
fn a_containers_own_restart_policy_restarts_it_in_a_never_pod() {
    let mut w = jobset_never(None, 0);
    w.container_policy = Some(RestartPolicy::OnFailure);
    let r = rem(&w);
    assert_eq!(kind(&r), "in-place-kill", "{}", r.how());
    w.container_policy = Some(RestartPolicy::Never);
    assert_eq!(kind(&rem(&w)), "refuse");
}

#[test]
fn restart_rules_restart_in_place_when_they_match_a_kill() {
    let with = |action: &str, exit: ExitCodes| {
        let mut w = jobset_never(None, 0);
        w.rules = vec![RestartRule { action: action.into(), exit_codes: Some(exit) }];
        rem(&w)
    };
    let r = with("Restart", codes(true, &[137, 143]));
    assert_eq!(kind(&r), "in-place-kill", "{}", r.how());
    assert!(!r.fails_pod() && r.restarted_in_place());
    assert_eq!(kind(&with("RestartAllContainers", codes(false, &[0]))), "in-place-kill");
    // A rule that does not match 137 is not a restart: the Job's path decides (refused here:
    // no failure policy).
    assert_eq!(kind(&with("Restart", codes(true, &[42]))), "refuse");
    // The first rule whose codes match decides: a rule that is no restart shadows a later one.
    let mut w = jobset_never(None, 0);
    w.rules = vec![
        RestartRule { action: "Stop".into(), exit_codes: Some(codes(true, &[137])) },
        RestartRule { action: "Restart".into(), exit_codes: Some(codes(true, &[137])) },
    ];
    assert_eq!(kind(&rem(&w)), "refuse");
}

#[test]
fn a_leaderworkerset_that_recreates_its_group_restarts_one_member() {
    let w = Workload {
        lws: Some(LwsFacts { name: "ml/serve".into(), group: "0".into(), recreate_group: true }),
        ..pod(RestartPolicy::Always)
    };
    let r = rem(&w);
    assert_eq!(kind(&r), "one-for-all", "{}", r.how());
    assert!(!r.kills() && !r.fails_pod() && !r.restarted_in_place());
    assert!(matches!(&r, Remediation::OneForAll { whole, .. } if whole == "lws:ml/serve/0"));
    let mut w = w;
    w.lws.as_mut().unwrap().recreate_group = false;
    assert_eq!(kind(&rem(&w)), "in-place");
}

/// Every shape, every fact: whatever the answer, a kill is chosen wherever a Job owns the pod
/// (a polite exit 0 would complete it), and nothing but a refusal where a stop fails a Job no
/// JobSet restarts.
#[test]
fn across_every_shape_a_jobs_pod_is_killed_and_a_failed_job_is_never_left_behind() {
    use RestartPolicy::*;
    for policy in [Always, OnFailure, Never] {
        for limit in 0..3u32 {
            for retries in 0..3u32 {
                for parallelism in 1..3u32 {
                    for js in [
                        None,
                        Some(jobset(None, 0)),
                        Some(jobset(Some(1), 0)),
                        Some(jobset(Some(1), 1)),
                    ] {
                        let w = Workload {
                            job: (policy != Always).then(|| job(limit, retries, parallelism)),
                            jobset: js.clone(),
                            ..pod(policy)
                        };
                        let r = rem(&w);
                        let fails = |stops: u32| match policy {
                            Always => false,
                            OnFailure => retries + stops >= limit,
                            Never => retries + stops > limit,
                        };
                        // One stop fails the Job (a JobSet may restart it all), or only all of
                        // them would, partway: refused.
                        let fails_job = fails(1);
                        if fails(parallelism) && !fails_job {
                            assert_eq!(kind(&r), "refuse", "{w:?}: {r:?}");
                        }
                        let restarts = js
                            .as_ref()
                            .is_some_and(|j| j.max_restarts.is_some_and(|m| j.restarts < m));
                        if policy != Always && !matches!(r, Remediation::Refuse(_)) {
                            assert!(r.kills(), "{w:?}: {r:?}");
                        }
                        if fails_job && !restarts {
                            assert_eq!(kind(&r), "refuse", "{w:?}: {r:?}");
                        }
                        if fails_job && restarts {
                            assert_eq!(kind(&r), "one-for-all-kill", "{w:?}: {r:?}");
                        }
                        // Room for every pod: never refused (counted, by a kill).
                        if policy != Always && !fails(parallelism) {
                            let k = kind(&r);
                            assert!(k == "in-place-kill" || k == "replace", "{w:?}: {r:?}");
                        }
                    }
                }
            }
        }
    }
}

/// Outside a Job too: wherever the worker container's restart policy (its own, or its pod's) is
/// `OnFailure`, a restart in place is a kill — an exit 0 at SIGTERM would never be restarted —
/// and a `Never` container is restarted only by a rule or not at all.
#[test]
fn across_every_bare_pod_an_on_failure_container_is_killed() {
    use RestartPolicy::*;
    for policy in [Always, OnFailure, Never] {
        for own in [None, Some(Always), Some(OnFailure), Some(Never)] {
            let w = Workload { container_policy: own, ..pod(policy) };
            let r = rem(&w);
            let effective = own.unwrap_or(policy);
            if effective == OnFailure && r.restarted_in_place() {
                assert!(r.kills(), "{w:?}: {r:?}");
            }
            if effective == Never {
                assert_eq!(kind(&r), "refuse", "{w:?}: {r:?}");
            }
            if effective == Always {
                assert!(r.restarted_in_place(), "{w:?}: {r:?}");
            }
        }
    }
}

/// A gang's decision reserves room in `backoffLimit` for every pod of the Job; each member, as
/// it carries the decision out, needs room for itself only (the members stopped before it have
/// already raised the count).
#[test]
fn a_member_carrying_out_a_decision_needs_room_for_itself_only() {
    let w = |retries| Workload { job: Some(job(4, retries, 4)), ..pod(RestartPolicy::Never) };
    assert_eq!(kind(&remediation(&w(0), Stops::EveryPod)), "replace");
    assert_eq!(kind(&remediation(&w(1), Stops::EveryPod)), "refuse");
    for stopped in 0..4 {
        let r = remediation(&w(stopped), Stops::One);
        assert_eq!(kind(&r), "replace", "member {}: {}", stopped + 1, r.how());
    }
    assert_eq!(kind(&remediation(&w(4), Stops::One)), "refuse");
}

#[test]
fn an_owner_the_api_does_not_have_or_a_rule_on_the_message_is_unknown_and_refused() {
    let mut w = jobset_never(Some(3), 0);
    w.missing = Some("JobSet ml/train".into());
    let r = rem(&w);
    assert!(
        matches!(&r, Remediation::Refuse(why) if why.contains("which the API does not have")),
        "{r:?}"
    );
    let mut w = jobset_never(Some(3), 0);
    let mut on_message = rule("FailJobSet", &[], &[]);
    on_message.on_message = true;
    w.jobset.as_mut().unwrap().rules = vec![on_message];
    let r = rem(&w);
    assert!(matches!(&r, Remediation::Refuse(why) if why.contains("message")), "{r:?}");
}

/// A restart rule (or the container's own policy) restarts in place uncounted only where no
/// Job counts the container's restarts: under an OnFailure Job's pod the Job's row decides.
#[test]
fn a_restart_rule_under_an_on_failure_job_is_still_counted() {
    let w = Workload {
        job: Some(job(1, 0, 1)),
        rules: vec![RestartRule {
            action: "Restart".into(),
            exit_codes: Some(codes(true, &[137])),
        }],
        ..pod(RestartPolicy::OnFailure)
    };
    let r = rem(&w);
    assert_eq!(kind(&r), "refuse", "0 + 1 reaches backoffLimit 1: {}", r.how());
    // A container that will not be restarted in a pod that would be: a stop ends it.
    let w = Workload { container_policy: Some(RestartPolicy::Never), ..pod(RestartPolicy::Always) };
    let r = rem(&w);
    assert!(
        matches!(&r, Remediation::Refuse(why) if why.contains("restartPolicy Never of its own")),
        "{r:?}"
    );
}
