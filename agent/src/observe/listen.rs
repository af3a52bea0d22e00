//! Serving a router on a listener — TCP for metrics and probes, TCP or a unix socket for the
//! worker API — with a header-read timeout, and telling each request who connected ([`Peer`], a
//! request extension), which the worker API needs to authenticate a unix-socket peer.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::{Extension, Router};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use crate::sources::peer::Procfs;

/// Who connected, as the kernel says: a TCP address, or a unix-socket peer's process and the
/// container it runs in (read once, at accept).
#[derive(Debug, Clone)]
pub enum Peer {
    Tcp(SocketAddr),
    Unix {
        pid: i32,
        /// The peer's container id (`Ok(None)`: a host process), or why it is unknown.
        container: Result<Option<String>, String>,
    },
}

/// A listener the server accepts connections from.
pub trait Listen: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&mut self) -> impl Future<Output = std::io::Result<(Self::Io, Peer)>> + Send;
}

impl Listen for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&mut self) -> std::io::Result<(Self::Io, Peer)> {
        let (stream, addr) = tokio::net::TcpListener::accept(self).await?;
        Ok((stream, Peer::Tcp(addr)))
    }
}

/// A unix socket whose peers are named by their process's cgroup.
pub struct UnixPeers {
    pub listener: tokio::net::UnixListener,
    pub procfs: Procfs,
}

impl Listen for UnixPeers {
    type Io = tokio::net::UnixStream;
    async fn accept(&mut self) -> std::io::Result<(Self::Io, Peer)> {
        let (stream, _) = self.listener.accept().await?;
        // NB: read at accept, while the peer is connected and its pid cannot have been reused.
        let peer = match stream.peer_cred() {
            Ok(cred) => {
                let pid = cred.pid().unwrap_or(0);
                Peer::Unix {
                    pid,
                    container: self.procfs.container_of_pid(pid),
                }
            }
            Err(e) => Peer::Unix {
                pid: 0,
                container: Err(format!("no peer credentials: {e}")),
            },
        };
        Ok((stream, peer))
    }
}

/// Binds the worker API's unix socket at `path`: its directory is created, a socket left by an
/// earlier run is replaced (never another kind of file), and anyone may connect — the peer's
/// container, not the file mode, is the identity.
pub fn bind_unix(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            ))
        }
        Err(_) => {}
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

/// hyper directly rather than `axum::serve`, which sets no timer and so no header-read timeout:
/// a client that connects and says nothing would hold its connection forever. Serves until
/// `shutdown` fires, then lets requests in flight finish.
pub(crate) async fn serve_router<L: Listen>(
    mut listener: L,
    app: Router,
    shutdown: CancellationToken,
    header_timeout: Duration,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "server: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let service = TowerToHyperService::new(app.clone().layer(Extension(peer)));
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "server: connection ended with an error");
            }
        });
    }
    connections.close();
    connections.wait().await;
}

#[cfg(test)]
mod tests {
    use super::bind_unix;

    #[test]
    fn a_stale_socket_is_replaced_and_another_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/vigil/worker.sock");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            drop(bind_unix(&path).unwrap());
            // The socket file outlives its listener; a second start replaces it.
            assert!(path.exists());
            bind_unix(&path).unwrap();
            let file = dir.path().join("plain");
            std::fs::write(&file, "x").unwrap();
            assert!(bind_unix(&file).is_err());
            assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
        });
    }
}
