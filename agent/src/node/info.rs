//! Follows this machine's Node: reads it every `kubernetes.read_interval` (one GET, bounded by
//! `crate::kube::client::CALL_TIMEOUT`), makes a [`NodeInfo`] of it
//! (`crate::node::policy_info::parse`) and publishes it on a `watch` channel whenever it changes.
//!
//! The channel holds `None` until the first read succeeds; a failed read keeps the last value
//! (a Node that cannot be read has not changed as far as the agent knows) and is said once per
//! outage. Whoever needs the Node's facts (the maintenance controller, the agent's record, the
//! TPU health source) holds a receiver: see [`channel`] and `crate::app`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::kube::node_source::NodeReader;
use crate::metrics::Metrics;
use crate::node::policy_info::parse;
use crate::vocab::node_info::NodeInfo;

/// What the Node source publishes: `None` until the Node was read once.
pub(crate) type NodeInfoRx = watch::Receiver<Option<NodeInfo>>;

/// A fresh channel, empty until the first read.
pub fn channel() -> (watch::Sender<Option<NodeInfo>>, NodeInfoRx) {
    watch::channel(None)
}

/// Read `node` through `reader` every `every` until `stop`, publishing on `tx`.
pub async fn follow(
    reader: Arc<dyn NodeReader>,
    node: String,
    every: Duration,
    tx: watch::Sender<Option<NodeInfo>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut failing = false;
    let mut said: Vec<String> = Vec::new();
    loop {
        match reader.read(&node).await {
            Ok(raw) => {
                if failing {
                    tracing::info!(node = %node, "the Node can be read again");
                }
                failing = false;
                let info = parse(&raw);
                // Each malformed value is said once, not at every read.
                for p in info.problems.iter().filter(|p| !said.contains(p)) {
                    tracing::warn!(node = %node, "Node label: {p}");
                }
                said.clone_from(&info.problems);
                tx.send_if_modified(|cur| cur.replace(info) != *cur);
            }
            Err(e) => {
                metrics.kube.error("get");
                if !failing {
                    tracing::warn!(node = %node, error = %e, "could not read the Node; its labels as last read stand until it can be read again");
                }
                failing = true;
            }
        }
        if stop.run_until_cancelled(tokio::time::sleep(every)).await.is_none() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::node_source::NodeReadError;
    use crate::vocab::node_info::RawNode;
    use std::sync::Mutex;

    /// Answers from a script, then the last answer again.
    struct Scripted(Mutex<Vec<Result<RawNode, String>>>);

    #[async_trait::async_trait]
    impl NodeReader for Scripted {
        async fn read(&self, node: &str) -> Result<RawNode, NodeReadError> {
            let mut s = self.0.lock().unwrap();
            let answer = if s.len() > 1 { s.remove(0) } else { s[0].clone() };
            answer.map_err(|message| NodeReadError::NotFound { node: node.to_string(), message })
        }
    }

    fn pool(p: &str) -> RawNode {
        RawNode {
            labels: [("cloud.google.com/gke-nodepool".to_string(), p.to_string())].into(),
            ..RawNode::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn publishes_changes_and_keeps_the_last_value_through_errors() {
        let reader = Arc::new(Scripted(Mutex::new(vec![
            Err("down".into()),
            Ok(pool("a")),
            Err("down".into()),
            Ok(pool("a")),
            Ok(pool("b")),
        ])));
        let metrics = Arc::new(Metrics::new());
        let (tx, mut rx) = channel();
        let stop = CancellationToken::new();
        let every = Duration::from_secs(30);
        let task =
            tokio::spawn(follow(reader, "n".into(), every, tx, metrics.clone(), stop.clone()));
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().as_ref().unwrap().pool.as_deref(), Some("a"));
        // The error and the unchanged read publish nothing; the next change does.
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().as_ref().unwrap().pool.as_deref(), Some("b"));
        stop.cancel();
        task.await.unwrap();
        let text = metrics.encode();
        assert!(text.contains("vigil_kube_errors_total{op=\"get\"} 2"), "{text}");
    }
}
