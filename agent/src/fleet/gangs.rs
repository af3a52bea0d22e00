//! The gangs in the fleet view as `vigil status` / `vigil explain` show them, for the gangs the
//! node records name: each gang's members (read through `crate::hang::gang_marks`), its verdict,
//! its incident and its decision.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::clock::{human, Millis};
use crate::coord::{CoordError, Coordinator, Keys};
use crate::hang::gang_marks::{read_state, read_view};
#[cfg(test)]
use crate::hang::model_gang::tag;
use crate::hang::policy_fruitless::{self, Beat, RunOf};
use crate::hang::policy_gang::{self as gp, Timing};

fn untag(tag: &str) -> (String, Option<u32>) {
    let (gang, size) = tag.split_once('|').map_or((tag, None), |(g, n)| (g, n.parse().ok()));
    (gang.to_string(), size)
}

/// One gang as `vigil status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct GangView {
    pub(crate) gang: String,
    pub(crate) size: Option<u32>,
    pub(crate) members: usize,
    /// running, straggler, hung.
    pub(crate) verdict: &'static str,
    /// The member that stopped first (`<node>/<worker>`), when the gang is hung.
    pub(crate) first_stopped: Option<String>,
    pub(crate) stragglers: Vec<String>,
    pub(crate) incident: Option<String>,
    pub(crate) incident_since: Option<Millis>,
    pub(crate) decided_at: Option<Millis>,
    /// Why a restart of every member cannot happen now (empty: it can).
    pub(crate) blockers: Vec<String>,
}

/// The gangs that `tags` (from node records: worker → tag) name, each read and judged.
pub(crate) async fn views(
    coord: &dyn Coordinator,
    prefix: &str,
    t: &Timing,
    tags: impl IntoIterator<Item = String>,
    now: Millis,
) -> Result<Vec<GangView>, CoordError> {
    let keys = Keys::new(prefix, "-");
    let wanted: BTreeMap<String, Option<u32>> = tags.into_iter().map(|t| untag(&t)).collect();
    let mut out = Vec::new();
    for (gang, size) in wanted {
        let members = gp::present(&read_view(coord, &keys, &gang, size, None).await?, now, t);
        let state = read_state(coord, &keys, &gang).await?;
        let verdict = gp::verdict(&members, now);
        let (first_stopped, stragglers) = match &verdict {
            gp::GangVerdict::Hung { first } => (Some(first.clone()), vec![]),
            gp::GangVerdict::Straggler(ids) => (None, ids.clone()),
            gp::GangVerdict::Running => (None, vec![]),
        };
        let mut blockers = gp::blockers(&members, size, now, t);
        let (run, beat) = (state.fruitless.as_ref(), Beat::of_members(&members));
        if let Some(run) = policy_fruitless::refusal(run, &beat, t.max_fruitless) {
            blockers.insert(0, policy_fruitless::describe(run, RunOf::Gang(&gang)));
        }
        out.push(GangView {
            verdict: (&verdict).into(),
            members: members.len(),
            blockers,
            incident: state.incident.as_ref().map(|i| i.id.clone()),
            incident_since: state.incident.as_ref().map(|i| i.started),
            decided_at: state.current_decision().map(|d| d.decided),
            gang,
            size,
            first_stopped,
            stragglers,
        });
    }
    Ok(out)
}

/// The gangs section of `vigil status` and `vigil explain`.
pub(crate) fn render(gangs: &[GangView], now: Millis) -> String {
    if gangs.is_empty() {
        return String::new();
    }
    let mut s = String::from("\ngangs:\n");
    for g in gangs {
        let of = g.size.map_or_else(String::new, |n| format!("/{n}"));
        s.push_str(&format!("  {:<32} {:<10} {}{of} members", g.gang, g.verdict, g.members));
        if let Some(f) = &g.first_stopped {
            s.push_str(&format!("; first stopped: {f}"));
        }
        if !g.stragglers.is_empty() {
            s.push_str(&format!("; stopped: {}", g.stragglers.join(", ")));
        }
        if let (Some(id), Some(t)) = (&g.incident, g.incident_since) {
            s.push_str(&format!("; incident {id} for {}", human(now - t)));
        }
        if let Some(d) = g.decided_at {
            s.push_str(&format!("; restart of every member decided {} ago", human(now - d)));
        }
        s.push('\n');
        if g.verdict == "hung" && g.decided_at.is_none() {
            for b in &g.blockers {
                s.push_str(&format!("      blocked: {b}\n"));
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_carries_the_size_when_known() {
        assert_eq!(untag(&tag("ml/a", Some(4))), ("ml/a".to_string(), Some(4)));
        assert_eq!(untag(&tag("ml/a", None)), ("ml/a".to_string(), None));
    }

    #[test]
    fn the_section_names_the_verdict_the_first_stopped_and_what_blocks() {
        let g = GangView {
            gang: "ml/a".into(),
            size: Some(4),
            members: 3,
            verdict: "hung",
            first_stopped: Some("gpu-2/rank-2".into()),
            stragglers: vec![],
            incident: Some("g1".into()),
            incident_since: Some(0),
            decided_at: None,
            blockers: vec!["1 of 4 members missing".into()],
        };
        let text = render(&[g], 60_000);
        assert!(text.contains("ml/a") && text.contains("hung") && text.contains("3/4 members"));
        assert!(
            text.contains("first stopped: gpu-2/rank-2") && text.contains("incident g1 for 1m")
        );
        assert!(text.contains("blocked: 1 of 4 members missing"), "{text}");
        assert_eq!(render(&[], 0), "");
    }
    #[tokio::test]
    async fn a_gang_whose_restarts_do_not_help_says_so_first_among_its_blockers() {
        use crate::clock::FakeClock;
        use crate::coord::memory::MemoryCoordinator;
        use std::sync::Arc;
        let now = 10_000_000;
        let coord: Arc<dyn Coordinator> =
            Arc::new(MemoryCoordinator::new(Arc::new(FakeClock::at(now))));
        let keys = Keys::new("vigil", "-");
        let t = Timing::of(&crate::config::Config::default());
        for node in ["gpu-0", "gpu-1"] {
            let entry = serde_json::json!({"n": node, "w": "rank", "v": "hung", "s": "w",
                "hb": now - 300_000, "p": 41_200, "ok": 120_000, "at": now - 1_000, "br": 3});
            let field = format!("{node}/rank");
            let shard = keys.gang_members("ml/a", gp::shard_of(node, 1));
            coord.hset(&shard, &[(field, entry.to_string())], None).await.unwrap();
        }
        let run = "2:1000:9000000:41200";
        coord
            .set(&keys.gang_fruitless("ml/a"), run, std::time::Duration::from_secs(60))
            .await
            .unwrap();
        let v = views(coord.as_ref(), "vigil", &t, [tag("ml/a", Some(2))], now).await.unwrap();
        assert_eq!(v[0].verdict, "hung");
        assert!(
            v[0].blockers[0].starts_with(
                "restarts are not helping: 2 restart(s) of every member, no progress past step 41200"
            ),
            "{:?}",
            v[0].blockers
        );
        assert!(render(&v, now).contains("blocked: restarts are not helping"));
        // With a limit of 3 there is one restart left: nothing blocks.
        let three = Timing { max_fruitless: 3, ..t };
        let v = views(coord.as_ref(), "vigil", &three, [tag("ml/a", Some(2))], now).await.unwrap();
        assert!(v[0].blockers.is_empty(), "{:?}", v[0].blockers);
    }
}
