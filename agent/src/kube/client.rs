//! The Kubernetes API client the pod readers share (`pods`, `workloads`, the Node source, the
//! token reviews): one way to connect (`kubernetes.api_url`, or the in-cluster ServiceAccount /
//! the kubeconfig) with short deadlines, and the errors worded for the operator.

/// Why no client for the Kubernetes API could be made, the cause kept.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("no Kubernetes configuration (in-cluster or kubeconfig): {0}")]
    Config(#[source] kube::config::InferConfigError),
    #[error("kubernetes.api_url {url:?} is not a URL: {source}")]
    BadUrl { url: String, source: crate::BoxError },
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// Why the pods could not be read, worded for the operator, the cause kept.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("the Kubernetes API did not answer within {}s", .0.as_secs())]
    Timeout(std::time::Duration),
    /// A refusal: the missing RBAC rule.
    #[error("forbidden: the agent's ServiceAccount needs `{verb}` on `{resource}` (deploy/base/rbac.yaml): {message}")]
    Forbidden { verb: &'static str, resource: &'static str, message: String },
    #[error("cannot {verb} {resource}: {source}")]
    Api { verb: &'static str, resource: &'static str, source: kube::Error },
    #[error("unknown restartPolicy {0:?}")]
    UnknownPolicy(Option<String>),
    /// What a stand-in for the API (a test's, a demo's) does not serve.
    #[error("{0}")]
    Unsupported(&'static str),
    /// An object Vigil would make exists and is someone else's (said whole).
    #[error("{0}")]
    Taken(String),
}

/// How long one Kubernetes API call may take (a pods call, a Node read or write): the callers (a
/// read before a restart, a token review before a worker's write, the Node controller) must not
/// hang on a silent API server.
pub(crate) const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl PodError {
    /// One call, bounded by [`CALL_TIMEOUT`], its error worded for the operator (a refusal
    /// names the missing rule).
    pub(crate) async fn bounded<T>(
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
        verb: &'static str,
        resource: &'static str,
    ) -> Result<T, PodError> {
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Err(_) => Err(PodError::Timeout(CALL_TIMEOUT)),
            Ok(Err(kube::Error::Api(e))) if e.code == 403 => {
                Err(PodError::Forbidden { verb, resource, message: e.message })
            }
            Ok(r) => r.map_err(|source| PodError::Api { verb, resource, source }),
        }
    }
}

/// A client for `kubernetes.api_url`, or (empty) the in-cluster ServiceAccount / the
/// kubeconfig, with short deadlines: the callers (a read before a restart, a token review before
/// a worker's write) must not hang on a silent API server for kube's default 295 s.
pub(crate) async fn kube_client(api_url: &str) -> Result<kube::Client, ConnectError> {
    let mut config = if api_url.is_empty() {
        kube::Config::infer().await.map_err(ConnectError::Config)?
    } else {
        let url = api_url
            .parse()
            .map_err(|e| ConnectError::BadUrl { url: api_url.to_string(), source: Box::new(e) })?;
        kube::Config::new(url)
    };
    config.connect_timeout = Some(std::time::Duration::from_secs(5));
    config.read_timeout = Some(CALL_TIMEOUT);
    kube::Client::try_from(config).map_err(ConnectError::Client)
}
