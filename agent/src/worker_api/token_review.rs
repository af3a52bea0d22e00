//! Whose token is this? The API server's answer (a TokenReview, RBAC `create` on
//! `tokenreviews.authentication.k8s.io`), read as Vigil needs it: a pod, proven by a projected
//! ServiceAccount token minted for Vigil's audience and bound to that pod.
//!
//! A pod's answer is cached for `worker_api.review_cache` (bounded), so a worker beating every
//! few seconds costs the API server one review a minute; a refusal is never cached (it may be a
//! transient `authenticated: false`, and a flood of junk tokens must not fill the cache); the
//! API server being unreachable is an error, never a pass: writes fail closed. The cache is keyed
//! by the token's SHA-256, never the token: its memory is bounded by the entry count whatever
//! the tokens' size, and no token sits in the agent's memory after its request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use crate::kube::client::{kube_client, ConnectError, PodError};
use crate::runtime::container::PodIdentity;

/// The user-info extra keys the API server sets for a token bound to a pod
/// (`k8s.io/apiserver/pkg/authentication/serviceaccount`); `node-name` since Kubernetes 1.30.
pub(crate) const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
pub(crate) const POD_UID: &str = "authentication.kubernetes.io/pod-uid";
pub(crate) const NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// Cached answers at most (a few hundred bytes each); past it the expired ones go, then all.
const MAX_CACHED: usize = 4096;

/// What the cache is keyed by.
type Digest = [u8; 32];

/// A cache by token digest.
type Cache<V> = Mutex<HashMap<Digest, V>>;

fn digest(token: &str) -> Digest {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes());
    d.as_ref().try_into().expect("a SHA-256 digest is 32 bytes")
}

/// What a review proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reviewed {
    /// A ServiceAccount token bound to this pod, for Vigil's audience.
    Pod { pod: PodIdentity, node: Option<String> },
    /// Not a valid token for Vigil (HTTP 401): why, without the token.
    Refused(String),
    /// Valid, but not bound to a pod (a legacy Secret token, a user's token): HTTP 403.
    NotAPod(String),
}

/// The API server could not answer (HTTP 503): never treated as a pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot review the token: {0}")]
pub(crate) struct ReviewUnavailable(pub String);

#[async_trait]
pub(crate) trait TokenReviewer: Send + Sync {
    async fn review(&self, token: &str) -> Result<Reviewed, ReviewUnavailable>;
    /// What is known of `token` already, without asking the API server.
    fn standing(&self, _token: &str) -> Standing {
        Standing::Stranger
    }
}

/// What a reviewer knows of a token before reviewing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Its answer is cached: it costs the API server nothing.
    Known(Reviewed),
    /// It proved a pod lately (its answer has left the cache since): reviewing it again is a
    /// real worker's re-review, which no budget holds back.
    Vouched,
    /// Never seen to prove a pod (or refused since).
    Stranger,
}

/// How long a token that proved a pod is vouched for: a projected token lives an hour by
/// default and at most a day (`expirationSeconds`), and the kubelet rotates it before then.
const VOUCHED_FOR: Duration = Duration::from_secs(24 * 3600);

/// Reads a TokenReview's status for `audience`.
pub(crate) fn interpret(status: &TokenReviewStatus, audience: &str) -> Reviewed {
    if status.authenticated != Some(true) {
        let error = status.error.as_deref().filter(|e| !e.is_empty());
        let why = error.unwrap_or("the API server did not authenticate it");
        return Reviewed::Refused(format!("token refused: {why}"));
    }
    // NB: an empty `status.audiences` means "valid for the API server's own audience": an
    // ordinary ServiceAccount token, which the pod's every container and anyone it leaked to
    // holds. Only a token minted for Vigil's audience is a worker's word.
    let for_us = status.audiences.as_ref().is_some_and(|a| a.iter().any(|x| x == audience));
    if !for_us {
        let why = format!("the token is not for audience {audience:?}: mount a projected ServiceAccount token with `audience: {audience}`");
        return Reviewed::Refused(why);
    }
    let user = status.user.clone().unwrap_or_default();
    let username = user.username.unwrap_or_default();
    let extra = user.extra.unwrap_or_default();
    let first = |k: &str| extra.get(k).and_then(|v| v.first()).cloned();
    let account = username.strip_prefix("system:serviceaccount:");
    let namespace = account.and_then(|rest| rest.split(':').next()).map(str::to_string);
    match (namespace, first(POD_NAME), first(POD_UID)) {
        (Some(namespace), Some(name), Some(uid)) => {
            Reviewed::Pod { pod: PodIdentity { namespace, name, uid }, node: first(NODE_NAME) }
        }
        _ => Reviewed::NotAPod(format!(
            "the token of {username:?} is not bound to a pod: use a projected ServiceAccount token (serviceAccountToken volume), not a Secret"
        )),
    }
}

/// [`TokenReviewer`] through `kube`.
pub(crate) struct KubeTokenReview {
    client: kube::Client,
    audience: String,
}

impl KubeTokenReview {
    /// From `kubernetes.api_url`, or (empty) the in-cluster ServiceAccount / the kubeconfig.
    pub async fn connect(api_url: &str, audience: &str) -> Result<Self, ConnectError> {
        Ok(KubeTokenReview { client: kube_client(api_url).await?, audience: audience.to_string() })
    }
}

#[async_trait]
impl TokenReviewer for KubeTokenReview {
    async fn review(&self, token: &str) -> Result<Reviewed, ReviewUnavailable> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let audiences = Some(vec![self.audience.clone()]);
        let spec = TokenReviewSpec { token: Some(token.to_string()), audiences };
        let ask = TokenReview { spec, ..TokenReview::default() };
        // Bounded as the pod API's calls are (`PodError::bounded`, `CALL_TIMEOUT`); a 403 names
        // the missing RBAC rule.
        let params = PostParams::default();
        let call = api.create(&params, &ask);
        let resource = "tokenreviews.authentication.k8s.io";
        let review = PodError::bounded(call, "create", resource).await.map_err(|e| match e {
            // NB: kube's error text names the URL and the cause, never the request body.
            PodError::Api { source, .. } => ReviewUnavailable(source.to_string()),
            e => ReviewUnavailable(e.to_string()),
        })?;
        Ok(interpret(&review.status.unwrap_or_default(), &self.audience))
    }
}

/// Inserts into a map of at most [`MAX_CACHED`] entries: a new key past it drops the entries no
/// longer `fresh`, then all.
fn insert_bounded<V>(map: &Cache<V>, key: Digest, value: V, fresh: impl Fn(&V) -> bool) {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if map.len() >= MAX_CACHED && !map.contains_key(&key) {
        map.retain(|_, v| fresh(v));
        if map.len() >= MAX_CACHED {
            map.clear();
        }
    }
    map.insert(key, value);
}

/// A [`TokenReviewer`] that remembers pods' answers (not refusals, not failures) for a bounded
/// time, by the token's digest.
pub(crate) struct CachedReviews<R> {
    inner: R,
    ttl: Duration,
    answers: Cache<(Instant, Reviewed)>,
    /// Digests of tokens that proved a pod, and when (at most `MAX_CACHED`, 40 bytes each).
    vouched: Cache<Instant>,
}

impl<R: TokenReviewer> CachedReviews<R> {
    pub fn new(inner: R, ttl: Duration) -> Self {
        CachedReviews { inner, ttl, answers: Mutex::default(), vouched: Mutex::default() }
    }

    fn cached(&self, key: &Digest, now: Instant) -> Option<Reviewed> {
        let answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        let (at, answer) = answers.get(key)?;
        (now.saturating_duration_since(*at) < self.ttl).then(|| answer.clone())
    }

    fn remember(&self, key: Digest, now: Instant, answer: &Reviewed) {
        let fresh = |at: &Instant, ttl: Duration| now.saturating_duration_since(*at) < ttl;
        insert_bounded(&self.answers, key, (now, answer.clone()), |(at, _)| fresh(at, self.ttl));
        insert_bounded(&self.vouched, key, now, |at| fresh(at, VOUCHED_FOR));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.answers.lock().unwrap().len()
    }
}

#[async_trait]
impl<R: TokenReviewer> TokenReviewer for CachedReviews<R> {
    fn standing(&self, token: &str) -> Standing {
        let (key, now) = (digest(token), Instant::now());
        if let Some(answer) = self.cached(&key, now) {
            return Standing::Known(answer);
        }
        match self.vouched.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            Some(at) if now.saturating_duration_since(*at) < VOUCHED_FOR => Standing::Vouched,
            _ => Standing::Stranger,
        }
    }

    async fn review(&self, token: &str) -> Result<Reviewed, ReviewUnavailable> {
        let (key, now) = (digest(token), Instant::now());
        if let Some(answer) = self.cached(&key, now) {
            return Ok(answer);
        }
        let answer = self.inner.review(token).await?;
        if matches!(answer, Reviewed::Pod { .. }) {
            self.remember(key, now, &answer);
        } else {
            // NB: a token that proved a pod and is refused now (revoked, its pod gone) is
            // vouched for no more: repeating it must cost the sender's budget like any junk.
            self.vouched.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        }
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};

    use super::*;

    fn status(
        authenticated: bool,
        audiences: &[&str],
        extra: &[(&str, &str)],
    ) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
            error: None,
            user: Some(UserInfo {
                username: Some("system:serviceaccount:ml:trainer".into()),
                extra: Some(
                    extra
                        .iter()
                        .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..UserInfo::default()
            }),
        }
    }

    #[test]
    fn a_bound_token_for_our_audience_is_its_pod() {
        let s = status(
            true,
            &["vigil"],
            &[(POD_NAME, "trainer-0"), (POD_UID, "u-1"), (NODE_NAME, "gpu-7")],
        );
        assert_eq!(
            interpret(&s, "vigil"),
            Reviewed::Pod {
                pod: PodIdentity {
                    namespace: "ml".into(),
                    name: "trainer-0".into(),
                    uid: "u-1".into()
                },
                node: Some("gpu-7".into()),
            }
        );
    }

    #[test]
    fn unauthenticated_other_audiences_and_unbound_tokens_are_not_a_worker() {
        let bound = [(POD_NAME, "trainer-0"), (POD_UID, "u-1")];
        assert!(matches!(interpret(&status(false, &[], &bound), "vigil"), Reviewed::Refused(_)));
        // The API server's own audience (empty), or another one.
        assert!(matches!(interpret(&status(true, &[], &bound), "vigil"), Reviewed::Refused(_)));
        assert!(matches!(
            interpret(&status(true, &["https://kubernetes.default.svc"], &bound), "vigil"),
            Reviewed::Refused(_)
        ));
        // A Secret-based token carries no pod.
        assert!(matches!(interpret(&status(true, &["vigil"], &[]), "vigil"), Reviewed::NotAPod(_)));
        let mut user = status(true, &["vigil"], &bound);
        user.user.as_mut().unwrap().username = Some("alice@example.com".into());
        assert!(matches!(interpret(&user, "vigil"), Reviewed::NotAPod(_)));
        assert!(matches!(interpret(&TokenReviewStatus::default(), "vigil"), Reviewed::Refused(_)));
    }

    struct Counting(AtomicU32, Result<Reviewed, ReviewUnavailable>);

    #[async_trait]
    impl TokenReviewer for Arc<Counting> {
        async fn review(&self, _token: &str) -> Result<Reviewed, ReviewUnavailable> {
            self.0.fetch_add(1, Ordering::SeqCst);
            self.1.clone()
        }
    }

    fn a_pod() -> Reviewed {
        let pod =
            PodIdentity { namespace: "ml".into(), name: "trainer-0".into(), uid: "u-1".into() };
        Reviewed::Pod { pod, node: None }
    }

    #[tokio::test(start_paused = true)]
    async fn pods_are_reused_for_the_ttl_and_refusals_and_failures_never() {
        let ok = Arc::new(Counting(AtomicU32::new(0), Ok(a_pod())));
        let cache = CachedReviews::new(ok.clone(), Duration::from_secs(60));
        cache.review("t1").await.unwrap();
        cache.review("t1").await.unwrap();
        assert_eq!(ok.0.load(Ordering::SeqCst), 1);
        cache.review("t2").await.unwrap();
        assert_eq!(ok.0.load(Ordering::SeqCst), 2);
        tokio::time::advance(Duration::from_secs(61)).await;
        cache.review("t1").await.unwrap();
        assert_eq!(ok.0.load(Ordering::SeqCst), 3);

        // Issue 26: a transient `authenticated: false` is asked again at the next write.
        let refused = Arc::new(Counting(AtomicU32::new(0), Ok(Reviewed::Refused("x".into()))));
        let cache = CachedReviews::new(refused.clone(), Duration::from_secs(60));
        cache.review("t1").await.unwrap();
        cache.review("t1").await.unwrap();
        assert_eq!(refused.0.load(Ordering::SeqCst), 2);
        assert_eq!(cache.len(), 0);

        let down = Arc::new(Counting(AtomicU32::new(0), Err(ReviewUnavailable("down".into()))));
        let cache = CachedReviews::new(down.clone(), Duration::from_secs(60));
        assert!(cache.review("t1").await.is_err());
        assert!(cache.review("t1").await.is_err());
        assert_eq!(down.0.load(Ordering::SeqCst), 2);
    }

    /// Issue 41: a token that proved a pod is vouched for after its answer left the cache (its
    /// re-review is no stranger's); a refused one never is.
    #[tokio::test(start_paused = true)]
    async fn a_token_that_proved_a_pod_is_vouched_for_after_the_cache_forgets_it() {
        let ok = Arc::new(Counting(AtomicU32::new(0), Ok(a_pod())));
        let cache = CachedReviews::new(ok.clone(), Duration::from_secs(60));
        assert_eq!(cache.standing("t1"), Standing::Stranger);
        cache.review("t1").await.unwrap();
        assert_eq!(cache.standing("t1"), Standing::Known(a_pod()));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(cache.standing("t1"), Standing::Vouched, "the answer expired");
        tokio::time::advance(VOUCHED_FOR).await;
        assert_eq!(cache.standing("t1"), Standing::Stranger, "not for ever");
        let refused = Arc::new(Counting(AtomicU32::new(0), Ok(Reviewed::Refused("no".into()))));
        let cache = CachedReviews::new(refused, Duration::from_secs(60));
        cache.review("junk").await.unwrap();
        assert_eq!(cache.standing("junk"), Standing::Stranger);
    }

    /// A vouched token refused later (revoked) is vouched for no more: a leaked, revoked token
    /// cannot cause reviews past its sender's budget.
    #[tokio::test(start_paused = true)]
    async fn a_vouched_token_refused_later_is_vouched_no_more() {
        struct Flips(std::sync::Mutex<bool>);
        #[async_trait]
        impl TokenReviewer for Arc<Flips> {
            async fn review(&self, _t: &str) -> Result<Reviewed, ReviewUnavailable> {
                let revoked = *self.0.lock().unwrap();
                Ok(if revoked { Reviewed::Refused("revoked".into()) } else { a_pod() })
            }
        }
        let inner = Arc::new(Flips(std::sync::Mutex::new(false)));
        let cache = CachedReviews::new(inner.clone(), Duration::from_secs(60));
        cache.review("t1").await.unwrap();
        *inner.0.lock().unwrap() = true;
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(matches!(cache.review("t1").await.unwrap(), Reviewed::Refused(_)));
        assert_eq!(cache.standing("t1"), Standing::Stranger);
    }

    /// Issue 26: the cache holds digests, so its memory is bounded by its entry count whatever
    /// the tokens' size, and the count is bounded too.
    #[tokio::test(start_paused = true)]
    async fn the_cache_is_bounded_whatever_the_tokens() {
        let ok = Arc::new(Counting(AtomicU32::new(0), Ok(a_pod())));
        let cache = CachedReviews::new(ok.clone(), Duration::from_secs(600));
        let big = "x".repeat(300 * 1024);
        for i in 0..(MAX_CACHED + 10) {
            cache.review(&format!("{big}{i}")).await.unwrap();
            assert!(cache.len() <= MAX_CACHED);
        }
        // Keyed by the digest: each entry is 32 bytes of key, not 300 kB of token.
        assert_eq!(std::mem::size_of::<Digest>(), 32);
        assert_ne!(digest("a"), digest("b"));
    }
}
