//! Checkpoint rounds of gangs and drills (pure): the round's budget, whether it was acknowledged,
//! what the Node, the Event and the trail say about it, and a drill's verdict.

use std::time::Duration;

use crate::clock::{brief, duration, Millis};
use crate::hang::model_gang::Member;
use crate::maintenance::model_round::{GangRound, MemberAck};
use crate::vocab::maintenance::DrillResult;

/// The most member names a summary lists (the Node's annotation must stay short).
const NAMED: usize = 8;
/// The most characters of a silent member's state a summary shows.
const STATE_CHARS: usize = 32;

/// The round's budget: this node's own for the reason, cut to the tightest budget any member's
/// node advertises for it (a member on a Spot node of a mixed pool has 30 s, not the hour a
/// maintenance notice gives). Reasons without a per-member budget (the agent's SIGTERM, a
/// drill) keep this node's.
pub(crate) fn round_budget(own: Duration, reason: &str, members: &[Member]) -> Duration {
    let of = |m: &Member| match reason {
        "preemption" => m.preemption_budget,
        "host-maintenance" => m.maintenance_budget,
        _ => None,
    };
    let budgets = members.iter().filter_map(of).map(duration);
    budgets.filter(|d| !d.is_zero()).fold(own, Duration::min)
}

/// Whether every member answered: all asked acknowledged this round's id, the gang's view was
/// read (else the members elsewhere are unknown), and the gang's expected size is met (a member
/// missing from the view cannot have saved its shards).
pub(crate) fn acknowledged(r: &GangRound) -> bool {
    r.view_read
        && !r.members.is_empty()
        && r.members.iter().all(|m| m.acked.is_some())
        && r.size.is_none_or(|n| r.members.len() >= n as usize)
}

fn names(ids: &[String]) -> String {
    let mut s = ids[..ids.len().min(NAMED)].join(", ");
    if ids.len() > NAMED {
        s.push_str(&format!(" and {} more", ids.len() - NAMED));
    }
    s
}

/// `gang ml/llm round 3f…: acked by 3/4; no answer from node-b/trainer (within 25s)` — what the
/// Node's annotation, the Event and the trail say.
pub(crate) fn describe(r: &GangRound) -> String {
    let asked = r.members.len();
    let total = r.size.map_or(asked, |n| (n as usize).max(asked));
    let acked = r.members.iter().filter(|m| m.acked.is_some()).count();
    let by = if r.opened { String::new() } else { format!(" (opened by {})", r.round.by) };
    let mut s = format!("gang {} round {}{by}: acked by {acked}/{total}", r.gang, r.round.id);
    let mut silent = Vec::new();
    for m in r.members.iter().filter(|m| m.acked.is_none()) {
        // NB: the worker writes its state: bounded here, as it reaches the Node.
        let state: Option<String> = m.state.as_ref().map(|s| s.chars().take(STATE_CHARS).collect());
        silent.push(match state {
            Some(state) => format!("{} (state {state})", m.member),
            None => m.member.clone(),
        });
    }
    if !silent.is_empty() {
        let within = brief(duration(r.round.until - r.round.at));
        s.push_str(&format!("; no answer from {} within {within}", names(&silent)));
    }
    if !r.view_read {
        s.push_str("; the gang's view could not be read: only this node's members were asked");
    }
    if total > asked {
        s.push_str(&format!(
            "; {} member(s) of {total} not in the gang's view (never asked)",
            total - asked
        ));
    }
    s
}

/// A drill's result from its members' answers: `waited` is how long the drill waited in all
/// (what a member that never answered is charged).
pub(crate) fn drill_result(
    target: String,
    at: Millis,
    acks: &[MemberAck],
    waited: Millis,
    preemption: Duration,
    maintenance: Duration,
) -> DrillResult {
    let mut times: Vec<Millis> = acks.iter().map(|a| a.acked.unwrap_or(waited)).collect();
    times.sort_unstable();
    let missing: Vec<String> =
        acks.iter().filter(|a| a.acked.is_none()).map(|a| a.member.clone()).collect();
    // The last member's time, and the median (of an even count, the lower of the middle two).
    let all = times.last().copied().unwrap_or(waited);
    let p50 = times.get(times.len().saturating_sub(1) / 2).copied().unwrap_or(waited);
    let secs = |ms: Millis| ms.max(0) as f64 / 1000.0;
    // A budget is met when someone was asked and everyone acknowledged within it.
    let answered = !acks.is_empty() && missing.is_empty();
    let fits = |budget: Duration| answered && secs(all) <= budget.as_secs_f64();
    DrillResult {
        target,
        at,
        asked: acks.len(),
        acked: acks.len() - missing.len(),
        p50: secs(p50),
        all: secs(all),
        preemption_budget: preemption.as_secs_f64(),
        maintenance_budget: maintenance.as_secs_f64(),
        fits_preemption: fits(preemption),
        fits_maintenance: fits(maintenance),
        missing,
    }
}

/// The drill's verdict, one line per budget: `fits the 25 s preemption budget: no (p50 41.0 s,
/// all 52.0 s)`.
pub(crate) fn verdict(d: &DrillResult) -> Vec<String> {
    let fits = |what: &str, budget: f64, ok: bool| {
        format!("fits the {budget:.0} s {what} budget: {}", if ok { "yes" } else { "no" })
    };
    let DrillResult { target, acked, asked, p50, all, .. } = d;
    let mut lines = vec![
        format!("{target}: {acked}/{asked} acknowledged; p50 {p50:.1} s, all {all:.1} s"),
        fits("preemption", d.preemption_budget, d.fits_preemption),
        fits("maintenance", d.maintenance_budget, d.fits_maintenance),
    ];
    if !d.missing.is_empty() {
        lines.push(format!("no answer from {}", names(&d.missing)));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maintenance::model_round::Round;

    fn ack(member: &str, acked: Option<Millis>) -> MemberAck {
        MemberAck {
            member: member.into(),
            acked,
            state: acked.is_none().then(|| "processing".to_string()),
        }
    }

    fn round(members: Vec<MemberAck>, size: Option<u32>, opened: bool) -> GangRound {
        GangRound {
            gang: "ml/llm".into(),
            round: Round {
                id: "r1".into(),
                reason: "preemption".into(),
                at: 1_000,
                until: 26_000,
                by: "node-a".into(),
                drill: false,
            },
            opened,
            members,
            size,
            view_read: true,
        }
    }

    #[test]
    fn a_round_is_acknowledged_only_when_every_member_of_the_gang_answered() {
        let all = round(vec![ack("a/w", Some(10)), ack("b/w", Some(20))], Some(2), true);
        assert!(acknowledged(&all));
        assert_eq!(describe(&all), "gang ml/llm round r1: acked by 2/2");
        let one = round(vec![ack("a/w", Some(10)), ack("b/w", None)], Some(2), false);
        assert!(!acknowledged(&one));
        assert_eq!(
            describe(&one),
            "gang ml/llm round r1 (opened by node-a): acked by 1/2; no answer from b/w (state processing) within 25s"
        );
        // A member missing from the view is never counted as saved.
        let short = round(vec![ack("a/w", Some(10))], Some(2), true);
        assert!(!acknowledged(&short));
        assert!(describe(&short).ends_with("1 member(s) of 2 not in the gang's view (never asked)"));
        assert!(!acknowledged(&round(vec![], None, true)));
        // A view that could not be read: this node's members only, never "acknowledged".
        let mut blind = round(vec![ack("a/w", Some(10))], None, true);
        blind.view_read = false;
        assert!(!acknowledged(&blind));
        assert!(describe(&blind).contains("view could not be read"), "{}", describe(&blind));
        // A worker's state is bounded before it reaches the Node.
        let mut long = ack("b/w", None);
        long.state = Some("x".repeat(500));
        let text = describe(&round(vec![long], Some(1), true));
        assert!(
            text.contains(&format!("(state {})", "x".repeat(32))) && text.len() < 200,
            "{text}"
        );
    }

    #[test]
    fn the_budget_is_the_tightest_among_the_members_nodes() {
        let m = |p: Option<Millis>| -> Member {
            let mut v = serde_json::json!({"n": "n", "w": "w", "v": "running", "s": "w", "ok": 1, "at": 0,
                                           "bm": 3_600_000});
            if let Some(p) = p {
                v["bp"] = p.into();
            }
            serde_json::from_value(v).unwrap()
        };
        let own = Duration::from_secs(25);
        let members = [m(Some(20_000)), m(None), m(Some(28_000))];
        assert_eq!(round_budget(own, "preemption", &members), Duration::from_secs(20));
        assert_eq!(round_budget(own, "host-maintenance", &members), own);
        assert_eq!(round_budget(own, "sigterm", &members), own);
        assert_eq!(round_budget(own, "preemption", &[m(Some(0))]), own);
    }

    #[test]
    fn a_drill_fits_a_budget_when_every_ack_came_within_it() {
        let acks = [ack("a/w", Some(12_000)), ack("b/w", Some(41_000)), ack("c/w", Some(52_000))];
        let d = drill_result(
            "gang:g".into(),
            0,
            &acks,
            60_000,
            Duration::from_secs(30),
            Duration::from_secs(3600),
        );
        assert_eq!((d.p50, d.all, d.acked), (41.0, 52.0, 3));
        assert!(!d.fits_preemption && d.fits_maintenance);
        let v = verdict(&d);
        assert_eq!(v[1], "fits the 30 s preemption budget: no");
        assert_eq!(v[2], "fits the 3600 s maintenance budget: yes");
        let lost = [ack("a/w", Some(1_000)), ack("b/w", None)];
        let d = drill_result(
            "gang:g".into(),
            0,
            &lost,
            60_000,
            Duration::from_secs(30),
            Duration::from_secs(3600),
        );
        assert_eq!((d.all, d.acked), (60.0, 1));
        assert!(!d.fits_preemption && !d.fits_maintenance);
        assert_eq!(verdict(&d)[3], "no answer from b/w");
        let none = drill_result(
            "worker:n/w".into(),
            0,
            &[],
            5_000,
            Duration::from_secs(30),
            Duration::from_secs(60),
        );
        assert!(!none.fits_preemption);
    }
}
