//! The gang simulation's JobSet (`super`): its gang's members restarted one for all, and a
//! stand-in for its controller that recreates every member (the next attempt) a few ticks after
//! one fails; the invariant "one member for all" checked against what the agents did.

use vigil::clock::Millis;

use super::{worker, GangViolation, Phase, Sim, NODES, ONE_FOR_ALL, POLL_MS};

impl Sim {
    /// The one-for-all gang's member on node `n`, of the current attempt.
    pub(super) fn member_container(&self, n: usize) -> String {
        format!("c{n}-{ONE_FOR_ALL}-a{}", self.attempt)
    }

    /// Its controller's pod on node `n`: started now, restarted one for all.
    pub(super) fn add_one_for_all_member(&mut self, n: usize) {
        let id = self.member_container(n);
        let rt = &self.nodes[n].runtime;
        rt.add(&id, &worker(ONE_FOR_ALL));
        let started = jiff::Timestamp::from_millisecond(self.now()).expect("a time");
        rt.set_started_at(&id, &started.to_string());
        rt.set_remediation(
            &id,
            vigil::vocab::workload::Remediation::OneForAll {
                kill: true,
                how: "the simulation's JobSet restarts every member".into(),
                whole: "jobset:ml/b".into(),
            },
        );
    }

    /// The one-for-all gang's controller, a few ticks after a member failed: every member's pod
    /// deleted and created again (the next attempt), the job resuming from its checkpoint.
    pub(super) fn controller_restarts(&mut self, now: Millis) {
        if self.recreate_at.is_none_or(|t| now < t) {
            return;
        }
        self.recreate_at = None;
        for n in 0..NODES {
            let id = self.member_container(n);
            self.nodes[n].runtime.remove(&id);
        }
        self.attempt += 1;
        for n in 0..NODES {
            self.add_one_for_all_member(n);
            self.gangs[ONE_FOR_ALL].last_restart[n] = Some(now);
        }
        self.failed_this_attempt = 0;
        self.log(format!(
            "gang {ONE_FOR_ALL}: its controller restarts every member (attempt {})",
            self.attempt
        ));
        let back = 1 + self.rng.below(40);
        let truth = &mut self.gangs[ONE_FOR_ALL];
        truth.resumed(back);
        let pick = self.rng.below(4);
        let at = (pick != 0).then(|| now + self.rng.below(120) as Millis * 1_000);
        truth.stop_at = (pick == 1).then_some(truth.at_wave);
        truth.phase = Phase::Booting { at };
    }

    /// What the agents did to the one-for-all gang since the last check.
    pub(super) fn check_one_for_all(
        &mut self,
        now: Millis,
        cooldown: Millis,
    ) -> Result<(), GangViolation> {
        let g = ONE_FOR_ALL;
        for n in 0..NODES {
            let id = self.member_container(n);
            if self.nodes[n].runtime.restarts(&id) > 0 {
                return self.fail(
                    "one member for all",
                    format!("gang {g}: member {n} restarted in place ({id})"),
                );
            }
            let failed = self.nodes[n].runtime.failed();
            for c in failed.iter().skip(self.failed_seen[n]) {
                self.log(format!("gang {g}: member {n} failed ({c})"));
                self.judge_restart(g, n, now, cooldown, "failed")?;
                if self.failed_this_attempt > 0 {
                    return self.fail(
                        "one member for all",
                        format!("gang {g}: member {n} failed too, before the controller restarted the job for the first"),
                    );
                }
                self.wave_begins(g)?;
                self.stats.one_for_all += 1;
                self.failed_this_attempt += 1;
                self.gangs[g].last_restart[n] = Some(now);
                let delay = (1 + self.rng.below(3)) as Millis * POLL_MS;
                self.recreate_at = Some(now + delay);
            }
            self.failed_seen[n] = failed.len();
        }
        Ok(())
    }
}
