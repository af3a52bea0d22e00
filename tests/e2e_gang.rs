//! End-to-end, a distributed job hangs as a whole: four `vigil run` processes (four node names,
//! one Redis, the real Docker daemon), one rank each in its own container that ignores SIGTERM
//! like a rank blocked in a collective, rank 2 stopping first. Read as an operator reads it: the
//! webhook, the containers' start times, the fleet budget's counter, `vigil status`.

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use common::e2e::{decisions, ConfigParts, Setup};
use common::real::{
    beat, beat_first_then_together, eventually, explain, redis_get, shared_redis_url, unique,
    vigil, Receiver, VigilProcess, WorkerContainer,
};

const RANKS: usize = 4;

struct Rank {
    s: Setup,
    cfg: PathBuf,
    container: WorkerContainer,
    before: String,
}

fn config(s: &Setup, hook: &str) -> PathBuf {
    s.write_config(ConfigParts {
        policy: "cooldown = \"60s\"\nescalate_after = \"120s\"",
        tables: &format!(
            "[safety]\nlock_ttl = \"30s\"\n[alerts]\nwebhook_url = \"{hook}\"\nattempts = 2\ntimeout = \"2s\"\n"
        ),
        // NB: rank 2 is confirmed hung `stale_after + confirm_after` past its last beat, and the
        // others, which beat a little after it, must by then be past `stale_after` too (else
        // they still progress beside a stopped rank: a straggler). 1.5 s leaves that margin
        // for the beats' own process starts on a loaded machine (CI: three sequential `vigil
        // beat`s took longer than 500 ms's margin once).
        confirm_after: "1500ms",
        ..ConfigParts::default()
    })
}

/// `vigil beat` for rank `i` of the gang: working, at `step`.
fn beat_rank(r: &Rank, gang: &str, redis: &str, step: &str) {
    let (code, out, err) = beat(
        &r.cfg,
        &r.s.worker,
        "processing",
        &["--gang", gang, "--gang-size", "4", "--progress", step, "--job", "llama"],
        &[("REDIS_URL", redis)],
    );
    assert_eq!(code, 0, "vigil beat failed: {out} {err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn four_agents_restart_every_rank_of_a_hung_job_once_on_one_page_and_one_budget_unit() {
    let redis = shared_redis_url();
    let hook = Receiver::start().await;
    let prefix = unique("gang");
    let gang = unique("ml/llama-");
    let ranks: Vec<Rank> = (0..RANKS)
        .map(|i| {
            let mut s = Setup::new("gang");
            s.prefix = prefix.clone();
            s.worker = format!("rank-{i}");
            let cfg = config(&s, &hook.url);
            let container = WorkerContainer::start(&s.label, &s.worker);
            let before = container.started_at();
            Rank { s, cfg, container, before }
        })
        .collect();
    let agents: Vec<VigilProcess> = ranks
        .iter()
        .map(|r| VigilProcess::spawn(&["run"], &r.cfg, &[("REDIS_URL", &redis)]))
        .collect();
    let logs =
        || -> String { agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n") };
    // The job trains for a few seconds, then rank 2 stops first and the others block in the
    // next all-reduce 300 ms later, together (well inside confirm_after: no straggler in
    // between).
    for step in 0..4 {
        for r in &ranks {
            beat_rank(r, &gang, &redis, &format!("step-{step}"));
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let step_4 = |i: usize| beat_rank(&ranks[i], &gang, &redis, "step-4");
    beat_first_then_together(RANKS, 2, Duration::from_millis(300), step_4).await;

    let all_restarted = eventually(Duration::from_secs(60), || {
        ranks.iter().all(|r| r.container.started_at() != r.before)
    })
    .await;
    assert!(all_restarted, "not every rank restarted:\n{}", logs());
    // No second restart of anyone while the new incarnations boot.
    let after: Vec<String> = ranks.iter().map(|r| r.container.started_at()).collect();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let later: Vec<String> = ranks.iter().map(|r| r.container.started_at()).collect();
    assert_eq!(after, later, "a rank restarted twice:\n{}", logs());

    // Restarted together: every rank's restart is the gang's one incident, the one the gang's
    // decision opened (not a rank's own). How far apart the new incarnations start is the
    // daemon's business (it kills and starts four containers at once, slower on a loaded
    // machine), so the test asserts who decided, not how fast the daemon was.
    let text = logs();
    let decided = incidents(&text, "gang-decided");
    assert!(!decided.is_empty(), "no gang decision in the logs:\n{text}");
    assert!(decided.iter().all(|i| *i == decided[0]), "{decided:?}");
    let restarted = incidents(&text, "restarted");
    assert_eq!(restarted.len(), RANKS, "{restarted:?}\n{text}");
    assert!(
        restarted.iter().all(|i| *i == decided[0]),
        "a rank restarted outside the gang's incident {}: {restarted:?}\n{text}",
        decided[0]
    );

    // One hung page, naming the job and rank 2; one restarting; nothing per rank.
    let bodies = hook.bodies.lock().unwrap().clone();
    let hung: Vec<_> = bodies.iter().filter(|b| b["vigil"]["kind"] == "hung").collect();
    assert_eq!(hung.len(), 1, "{:?}\n{}", hook.kinds(), logs());
    assert_eq!(hung[0]["vigil"]["gang"], gang.as_str());
    assert_eq!(hung[0]["vigil"]["worker"], "rank-2", "{}", hung[0]);
    assert_eq!(hung[0]["vigil"]["node"], ranks[2].s.node.as_str());
    assert_eq!(hook.count("restarting"), 1, "{:?}", hook.kinds());
    assert_eq!(hook.count("straggler"), 0, "{:?}", hook.kinds());

    // One unit of the fleet budget (windows of an hour on Redis's clock; the test may straddle
    // two).
    let hour = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as i64
        / 3_600_000;
    let mut used = 0;
    for w in [hour - 1, hour, hour + 1] {
        let key = format!("{prefix}:fleet:budget:{w}");
        used += redis_get(&redis, &key).await.map_or(0, |v| v.parse::<i64>().unwrap());
    }
    assert_eq!(used, 1, "one fleet unit for the gang");
    // The gang's run of restarts that do not help counts this one, where the collective stopped
    // (`step-4`, as `vigil beat --progress` published it).
    let run =
        redis_get(&redis, &format!("{prefix}:gang:{{{gang}}}:fruitless")).await.unwrap_or_default();
    let parts: Vec<&str> = run.split(':').collect();
    assert_eq!((parts.first(), parts.last()), (Some(&"1"), Some(&"4")), "the gang's run: {run:?}");

    // `vigil status` shows the gang.
    let (code, out, err) =
        vigil(&["status", "--config", ranks[0].cfg.to_str().unwrap()], &[("REDIS_URL", &redis)]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("gangs:") && out.contains(&gang), "{out}");
    // `vigil explain` of a rank's node: its gang, and the gang's decisions in the trails.
    let (code, out, err) = explain(&ranks[0].cfg, &ranks[0].s.node, &[], &[("REDIS_URL", &redis)]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("gangs:") && out.contains(&gang), "{out}");
    let trails: String =
        ranks.iter().map(|r| explain(&r.cfg, &r.s.node, &[], &[("REDIS_URL", &redis)]).1).collect();
    assert_eq!(trails.matches("gang-decided").count(), 1, "{trails}");
    assert_eq!(decisions(&trails, "restarted"), RANKS, "{trails}");
}

/// The incident ids of the agents' trail lines with `decision="<decision>"`.
fn incidents(logs: &str, decision: &str) -> Vec<String> {
    let code = format!("decision=\"{decision}\"");
    logs.lines()
        .filter(|l| l.contains(&code))
        .filter_map(|l| l.split("incident=\"").nth(1)?.split('"').next().map(String::from))
        .collect()
}

/// A rank's pod labels: the opt-in label and JobSet's, as its controller puts them on every pod
/// of the set (restart attempt 0).
pub(crate) fn jobset_labels<'a>(s: &'a Setup, jobset: &'a str) -> [(&'a str, &'a str); 5] {
    [
        (s.label.as_str(), s.worker.as_str()),
        ("jobset.sigs.k8s.io/jobset-name", jobset),
        ("jobset.sigs.k8s.io/restart-attempt", "0"),
        ("jobset.sigs.k8s.io/replicatedjob-name", "workers"),
        ("batch.kubernetes.io/job-completion-index", "0"),
    ]
}

/// The agent of node `s` on the CRI socket `socket` (the test plays kubelet), the Kubernetes API
/// off: the pods' labels are all it knows of the job.
pub(crate) fn cri_config(s: &Setup, socket: &std::path::Path, hook: &str) -> PathBuf {
    s.write_config(ConfigParts {
        runtime: &format!(
            "kind = \"cri\"\ncri_socket = \"{}\"\nallow_pod_replacement = true\npod_resources_socket = \"\"",
            socket.display()
        ),
        policy: "cooldown = \"60s\"\nescalate_after = \"120s\"",
        tables: &format!(
            "[safety]\nlock_ttl = \"30s\"\n[alerts]\nwebhook_url = \"{hook}\"\nattempts = 2\ntimeout = \"2s\"\n[kubernetes]\nenabled = \"off\"\n[gpu]\nenabled = \"off\"\n[metadata]\nenabled = \"off\"\n"
        ),
        // NB: as in `config`: the rank that beat first is confirmed hung `stale_after +
        // confirm_after` past its beat, and the ranks that beat after it (separate `vigil
        // beat` processes) must be stale by then, else a straggler beside them. 1.5 s covers
        // those process starts on a loaded machine; raising it keeps the first beat the first
        // stopped (the page names it), which beating all at once would not.
        confirm_after: "1500ms",
        ..ConfigParts::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_containerd_the_pods_of_one_jobset_are_one_gang_without_a_gang_in_their_records() {
    use common::containerd::{Containerd, Kubelet};
    let redis = shared_redis_url();
    let hook = Receiver::start().await;
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let stop = tokio_util::sync::CancellationToken::new();
    kubelet.restart_loop(stop.clone());
    let prefix = unique("gang-cri");
    let jobset = unique("llama-");
    let mut nodes = Vec::new();
    for i in 0..RANKS {
        let mut s = Setup::new("gang-cri");
        s.prefix = prefix.clone();
        s.worker = format!("rank-{i}");
        let cfg = cri_config(&s, &ctd.socket(), &hook.url);
        let labels = jobset_labels(&s, &jobset);
        let pod = kubelet
            .run_pod(
                &format!("{jobset}-workers-{i}"),
                &labels,
                &[],
                &[("main", common::real::IGNORES_TERM)],
            )
            .await;
        nodes.push((s, cfg, pod));
    }
    let pods: Vec<_> = nodes.iter().map(|n| n.2.clone()).collect();
    let first = kubelet.running_ids(&pods, "main").await;
    // Records without a gang: `vigil beat` with no --gang. Rank 2 last beat first, the others
    // a moment later, together (inside confirm_after: no straggler in between).
    let beat_node = |i: usize| {
        let (s, cfg, _) = &nodes[i];
        let (code, out, err) =
            beat(cfg, &s.worker, "processing", &["--job", "llama"], &[("REDIS_URL", &redis)]);
        assert_eq!(code, 0, "{out} {err}");
    };
    beat_first_then_together(nodes.len(), 2, Duration::from_millis(200), beat_node).await;
    let agents: Vec<VigilProcess> = nodes
        .iter()
        .map(|(_, cfg, _)| VigilProcess::spawn(&["run"], cfg, &[("REDIS_URL", &redis)]))
        .collect();
    let logs = || agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n");
    let restarted = kubelet.all_restarted(&pods, "main", &first, Duration::from_secs(90)).await;
    assert!(restarted, "every rank restarted:\n{}", logs());
    tokio::time::sleep(Duration::from_secs(4)).await;
    for (_, _, pod) in &nodes {
        let attempts: Vec<u32> = kubelet.containers(pod).await.iter().map(|c| c.2).collect();
        assert_eq!(attempts, vec![0, 1], "one new attempt per rank:\n{}", logs());
    }
    let hung: Vec<_> = hook
        .bodies
        .lock()
        .unwrap()
        .iter()
        .filter(|b| b["vigil"]["kind"] == "hung")
        .cloned()
        .collect();
    assert_eq!(hung.len(), 1, "{:?}", hook.kinds());
    assert_eq!(hung[0]["vigil"]["worker"], "rank-2", "{}", hung[0]);
    assert_eq!(hung[0]["vigil"]["gang"], format!("default/jobset/{jobset}"));
    assert_eq!(hook.count("restarting"), 1, "{:?}", hook.kinds());
    stop.cancel();
}
