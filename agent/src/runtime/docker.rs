//! Docker Engine API adapter (bollard). The API version is negotiated with the daemon, so an
//! older engine (e.g. API 1.41) is spoken to in its own version.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use bollard::query_parameters::{
    InspectContainerOptions, KillContainerOptions, ListContainersOptions, LogsOptions,
    RestartContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use tokio::sync::Mutex;

use super::{Container, ContainerRuntime, RuntimeError};

/// Deadline of every call but the restart: a daemon that accepts and never answers is noticed in
/// seconds, not after the restart's long timeout (and `/readyz` never waits on it that long).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct DockerRuntime {
    host: String,
    label: String,
    checkpoint_label: String,
    /// The restart call's own deadline (it waits out the stop grace).
    timeout: Duration,
    client: Mutex<Option<Docker>>,
}

impl DockerRuntime {
    /// No connection is made here: a daemon that is down at start-up is reported per cycle.
    pub fn new(host: &str, label: &str, checkpoint_label: &str, timeout: Duration) -> Self {
        DockerRuntime {
            host: host.to_string(),
            label: label.to_string(),
            checkpoint_label: checkpoint_label.to_string(),
            timeout,
            client: Mutex::new(None),
        }
    }

    async fn client(&self) -> Result<Docker, RuntimeError> {
        let mut guard = self.client.lock().await;
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let c = Docker::connect_with_host(&self.host)
            .map_err(|e| self.unreachable(e))?
            .with_timeout(CALL_TIMEOUT);
        let c = c
            .negotiate_version()
            .await
            .map_err(|e| self.unreachable(e))?;
        *guard = Some(c.clone());
        Ok(c)
    }

    fn unreachable(&self, e: impl std::fmt::Display) -> RuntimeError {
        RuntimeError::Unreachable {
            runtime: self.describe(),
            detail: e.to_string(),
        }
    }

    /// Map a bollard error: transport problems mean the daemon is unreachable (and the cached
    /// client is dropped so the next call reconnects); API answers are refusals.
    async fn classify(
        &self,
        op: &'static str,
        id: &str,
        e: bollard::errors::Error,
    ) -> RuntimeError {
        use bollard::errors::Error as E;
        match e {
            E::DockerResponseServerError { message, .. } => RuntimeError::Refused {
                runtime: self.describe(),
                op,
                container: id.to_string(),
                detail: message,
            },
            E::RequestTimeoutError => RuntimeError::Timeout {
                op,
                container: id.to_string(),
                timeout: if op == "restart" {
                    self.timeout
                } else {
                    CALL_TIMEOUT
                },
            },
            other => {
                *self.client.lock().await = None;
                self.unreachable(other)
            }
        }
    }
}

#[async_trait]
impl ContainerRuntime for DockerRuntime {
    fn describe(&self) -> String {
        format!("docker at {}", self.host)
    }

    async fn list_workers(&self) -> Result<Vec<Container>, RuntimeError> {
        let c = self.client().await?;
        let mut filters = HashMap::new();
        filters.insert("label".to_string(), vec![self.label.clone()]);
        let opts = ListContainersOptions {
            // NB: exited ones too, so a worker whose container exited is reported, not forgotten
            // (the agent prefers a running container of the same worker).
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        let list = match c.list_containers(Some(opts)).await {
            Ok(l) => l,
            Err(e) => return Err(self.classify("list", "*", e).await),
        };
        let mut out = Vec::new();
        for summary in list {
            let Some(id) = summary.id else { continue };
            // The listing has no start time; inspect each (a node runs a handful of workers).
            if let Some(container) = self.inspect(&id).await? {
                out.push(container);
            }
        }
        Ok(out)
    }

    async fn inspect(&self, id: &str) -> Result<Option<Container>, RuntimeError> {
        let c = self.client().await?;
        let info = match c
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
        {
            Ok(i) => i,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(None),
            Err(e) => return Err(self.classify("inspect", id, e).await),
        };
        let labels = info
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        // NB: a container without the opt-in label is never returned, whatever its status says.
        let Some(worker) = labels.get(&self.label).filter(|w| !w.is_empty()) else {
            return Ok(None);
        };
        let state = info.state.as_ref();
        Ok(Some(Container {
            id: info.id.clone().unwrap_or_else(|| id.to_string()),
            name: info
                .name
                .clone()
                .unwrap_or_default()
                .trim_start_matches('/')
                .to_string(),
            worker: worker.clone(),
            started_at: state.and_then(|s| s.started_at.clone()).unwrap_or_default(),
            // NB: Docker says a paused container is running; for Vigil it is not (it must not be
            // restarted, and its stale heartbeat is no hang).
            running: state.and_then(|s| s.running).unwrap_or(false)
                && !state.and_then(|s| s.paused).unwrap_or(false),
            paused: state.and_then(|s| s.paused).unwrap_or(false),
            checkpoint: labels.get(&self.checkpoint_label).cloned(),
            gpus: {
                let ids: Option<Vec<String>> = info
                    .host_config
                    .as_ref()
                    .and_then(|h| h.device_requests.as_ref())
                    .map(|reqs| {
                        reqs.iter()
                            .flat_map(|r| r.device_ids.clone().unwrap_or_default())
                            .collect()
                    });
                let env = info
                    .config
                    .as_ref()
                    .and_then(|c| c.env.clone())
                    .unwrap_or_default();
                crate::model::container::visible_gpus(ids.as_deref(), &env)
            },
            pod: None,
        }))
    }

    async fn logs(&self, id: &str, lines: usize) -> Result<String, RuntimeError> {
        let c = self.client().await?;
        let opts = LogsOptions {
            stdout: true,
            stderr: true,
            tail: lines.to_string(),
            ..Default::default()
        };
        let mut stream = c.logs(id, Some(opts));
        let mut out = String::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(chunk) => out.push_str(&String::from_utf8_lossy(&chunk.into_bytes())),
                Err(e) => return Err(self.classify("logs", id, e).await),
            }
        }
        Ok(out)
    }

    async fn restart(&self, target: &Container, stop_grace: Duration) -> Result<(), RuntimeError> {
        let id = target.id.as_str();
        let c = self.client().await?.with_timeout(self.timeout);
        let opts = RestartContainerOptions {
            t: Some(stop_grace.as_secs().min(i32::MAX as u64) as i32),
            ..Default::default()
        };
        match c.restart_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.classify("restart", id, e).await),
        }
    }

    async fn kill(&self, id: &str, signal: &str) -> Result<(), RuntimeError> {
        let c = self.client().await?;
        let opts = KillContainerOptions {
            signal: signal.to_string(),
        };
        match c.kill_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.classify("kill", id, e).await),
        }
    }

    async fn ping(&self) -> Result<(), RuntimeError> {
        let c = self.client().await?;
        match c.ping().await {
            Ok(_) => Ok(()),
            Err(e) => Err(self.classify("ping", "-", e).await),
        }
    }
}
