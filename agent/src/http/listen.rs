//! Serving a router on a listener — TCP for metrics and probes, TCP or a unix socket for the
//! worker API — with a header-read timeout, and telling each request who connected ([`Peer`], a
//! request extension), which the worker API needs to authenticate a unix-socket peer.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::{Extension, Router};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::http::admission::{Admission, Admit, Slot, Tracked};
use crate::http::procfs::{CgroupUnknown, Procfs};

/// Who connected, as the kernel says: a TCP address, or a unix-socket peer's process and its
/// cgroups (read once, at accept).
#[derive(Debug, Clone)]
pub(crate) enum Peer {
    Tcp(SocketAddr),
    /// A unix-socket peer's pid, and its `/proc/<pid>/cgroup` or why that cannot be known.
    Unix {
        pid: i32,
        cgroup: Result<String, CgroupUnknown>,
    },
}

/// A listener the server accepts connections from.
pub(crate) trait Listen: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&mut self) -> impl Future<Output = std::io::Result<(Self::Io, Peer)>> + Send;
}

impl Listen for TcpListener {
    type Io = TcpStream;
    async fn accept(&mut self) -> std::io::Result<(Self::Io, Peer)> {
        let (stream, addr) = TcpListener::accept(self).await?;
        Ok((stream, Peer::Tcp(addr)))
    }
}

/// A unix socket whose peers are named by their process's cgroup.
pub(crate) struct UnixPeers {
    pub(crate) listener: UnixListener,
    pub(crate) procfs: Procfs,
}

impl Listen for UnixPeers {
    type Io = UnixStream;
    async fn accept(&mut self) -> std::io::Result<(Self::Io, Peer)> {
        let (stream, _) = self.listener.accept().await?;
        let peer = match stream.peer_cred() {
            Ok(cred) => {
                let pid = cred.pid().unwrap_or(0);
                Peer::Unix { pid, cgroup: cgroup_of_peer(&stream, pid, &self.procfs) }
            }
            Err(e) => Peer::Unix { pid: 0, cgroup: Err(CgroupUnknown::NoCredentials(Arc::new(e))) },
        };
        Ok((stream, peer))
    }
}

/// The peer's cgroups, read through its pid. NB: `SO_PEERCRED`'s pid is a number: the process
/// that connected may have exited and its pid gone to another process by the time it is read.
/// `SO_PEERPIDFD` (Linux 6.5) names the connecting process itself: when it is still alive after
/// the read, the number was its own. On an older kernel the read is at accept, while a peer that
/// waits for its answer is normally still connected.
fn cgroup_of_peer(stream: &UnixStream, pid: i32, procfs: &Procfs) -> Result<String, CgroupUnknown> {
    use std::os::fd::AsRawFd;
    let pidfd = pidfd::of_peer(stream.as_raw_fd()).ok();
    let cgroup = procfs.cgroup_of_pid(pid);
    // NB: a peer gone before its read is `Exited` whatever the read gave (its /proc entry gone:
    // no failure of the agent's, which the worker API warns of).
    match pidfd {
        Some(fd) if !pidfd::alive(&fd) => Err(CgroupUnknown::Exited(pid)),
        _ => Ok(cgroup?),
    }
}

/// The two pidfd calls the peer check needs; libc names neither on every target yet.
mod pidfd {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

    /// `SO_PEERPIDFD` on the generic socket-option table (x86_64, aarch64, riscv64).
    const SO_PEERPIDFD: libc::c_int = 77;

    /// A pidfd of the process that connected `fd`'s peer end.
    pub(super) fn of_peer(fd: RawFd) -> std::io::Result<OwnedFd> {
        let mut pidfd: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let out = (&mut pidfd as *mut libc::c_int).cast();
        // SAFETY: a c_int out-parameter of the size given; the kernel writes at most `len` bytes.
        let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, SO_PEERPIDFD, out, &mut len) };
        if r != 0 || pidfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel just opened this descriptor for us; nobody else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(pidfd) })
    }

    /// Signal 0 through the pidfd: delivered (or refused for permission) while the process
    /// lives; `ESRCH` once it has exited.
    pub(super) fn alive(pidfd: &OwnedFd) -> bool {
        let fd = pidfd.as_raw_fd();
        let no_info = std::ptr::null::<libc::siginfo_t>();
        // SAFETY: pidfd_send_signal(2) with signal 0, no siginfo and no flags only checks.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd, 0, no_info, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
}

/// Binds the worker API's unix socket at `path`, so that nobody but root can swap it or aim the
/// agent at another file:
/// - its directory is created (0755) when missing, and refused when someone other than the
///   agent's user (or root) owns it or others may write it: they could replace the socket and
///   swallow every worker's beats;
/// - the socket is bound and made connectable (0666) in a private directory of the agent's, then
///   renamed over `path`: no window in which a symlink at `path` turns the chmod onto a host
///   file, and whatever a previous run (or anyone) left at `path` is replaced, so a stray file
///   cannot stop the next start. A directory at `path` is refused.
///
/// Anyone may connect: the peer's container, not the file mode, is the identity. Workers mount
/// the directory read-only (connecting needs no write access to the mount).
pub(crate) fn bind_unix(path: &std::path::Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let refuse = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    let parent = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = parent.ok_or_else(|| refuse("the socket needs a directory of its own".into()))?;
    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir)?;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(refuse(format!("{} is a directory", path.display())));
    }
    let private =
        dir.join(format!(".vigil-bind-{}-{:08x}", std::process::id(), rand::random::<u32>()));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let bound = (|| {
        // NB: the private directory was made by this process, so its owner is the agent's user.
        let me = std::fs::metadata(&private)?.uid();
        let d = std::fs::metadata(dir)?;
        let owner = d.uid();
        if owner != me && owner != 0 {
            let dir = dir.display();
            let why = format!("{dir} belongs to uid {owner}: whoever owns the socket's directory can replace the socket; give it to root (or the agent's user)");
            return Err(refuse(why));
        }
        let mode = d.mode() & 0o7777;
        if mode & 0o022 != 0 {
            let dir = dir.display();
            let why = format!("{dir} is writable by group or others (mode {mode:o}): anyone who can write it can replace the socket; chmod go-w it");
            return Err(refuse(why));
        }
        let staged = private.join("worker.sock");
        let listener = UnixListener::bind(&staged)?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o666))?;
        std::fs::rename(&staged, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    bound
}

/// What a listener allows each client, so that no client (nor a flood of them) can hold the
/// agent's memory or its listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// A connection that has not sent a whole request head in this long is dropped.
    pub(crate) header_timeout: Duration,
    /// The largest request head (request line and headers) read; past it hyper answers 431.
    pub(crate) max_head: usize,
    /// Connections held at once; past it the one idle the longest gives way to a newcomer
    /// (`crate::http::admission`).
    pub(crate) max_connections: usize,
    /// Connections one peer (a TCP address; a unix-socket peer's cgroup) holds at once; past it
    /// that peer's own idle-longest connection gives way.
    pub(crate) per_peer: usize,
    /// A connection is closed (gracefully, after its request in flight) when this old, so idle
    /// keep-alive connections cannot hold the slots for ever.
    pub(crate) max_age: Duration,
}

/// hyper directly rather than `axum::serve`, which sets no timer and so no header-read timeout:
/// a client that connects and says nothing would hold its connection forever. Every connection
/// is accepted at once and admitted by [`Admission`] (no newcomer waits in the kernel's backlog
/// behind idle junk). Serves until `shutdown` fires, then lets requests in flight finish.
pub(crate) async fn serve_router<L: Listen>(
    mut listener: L,
    app: Router,
    shutdown: CancellationToken,
    limits: Limits,
) {
    let connections = tokio_util::task::TaskTracker::new();
    let table = Arc::new(Mutex::new(Admission::new(limits.max_connections, limits.per_peer)));
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
        let evict = CancellationToken::new();
        let admitted = table.lock().unwrap_or_else(|p| p.into_inner()).admit(
            &peer_key(&peer),
            tokio::time::Instant::now(),
            evict.clone(),
        );
        let Admit::Yes { id, .. } = admitted else {
            tracing::debug!("server: every held connection is in a request; closing a newcomer");
            continue;
        };
        // NB: the connection's service holds its slot: freed when the connection is dropped.
        let inner = TowerToHyperService::new(app.clone().layer(Extension(peer)));
        let service = Tracked { inner, slot: Arc::new(Slot { id, table: table.clone() }) };
        connections.spawn(serve_connection(stream, service, evict, shutdown.clone(), limits));
    }
    connections.close();
    connections.wait().await;
}

/// One admitted connection, served until it ends, gives way to a newcomer (`evict`), the server
/// stops, or it reaches `max_age`; its slot is freed when this returns.
async fn serve_connection(
    stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
    service: Tracked<TowerToHyperService<Router>>,
    evict: CancellationToken,
    shutdown: CancellationToken,
    limits: Limits,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_head)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        // NB: it gave way to a newcomer while idle: dropped, nothing in flight.
        _ = evict.cancelled() => return,
        // Shutdown, or the connection's `max_age` is up: what is in flight finishes.
        _ = tokio::time::timeout(limits.max_age, shutdown.cancelled()) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "server: connection ended with an error");
    }
}

/// Whom a connection counts against: its TCP address, or the unix-socket peer's cgroup (its
/// container; a host process by its pid).
fn peer_key(peer: &Peer) -> String {
    match peer {
        Peer::Tcp(addr) => addr.ip().to_string(),
        Peer::Unix { cgroup: Ok(c), .. } => c.lines().next().unwrap_or_default().to_string(),
        Peer::Unix { pid, .. } => format!("pid {pid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::{bind_unix, cgroup_of_peer};
    use crate::http::procfs::{CgroupUnknown, Procfs};

    /// Issue 26: `SO_PEERCRED`'s pid may belong to another process by the time it is read. A
    /// real peer (a python3 process) connects and exits before the accept; `/proc/<its pid>` is
    /// staged as if a new process had the number. The peer's pidfd says the connector is gone.
    #[tokio::test]
    async fn a_peer_that_exited_before_it_was_read_is_not_identified_by_its_old_pid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let status = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])",
                path.to_str().unwrap(),
            ])
            .status()
            .expect("python3");
        assert!(status.success());
        let (stream, _) = listener.accept().await.unwrap();
        let pid = stream.peer_cred().unwrap().pid().unwrap();
        let proc = dir.path().join("proc");
        std::fs::create_dir_all(proc.join(pid.to_string())).unwrap();
        let reused = "0::/system.slice/docker-aaaa.scope\n";
        std::fs::write(proc.join(pid.to_string()).join("cgroup"), reused).unwrap();
        let got = cgroup_of_peer(&stream, pid, &Procfs::at(&proc));
        let why = got.unwrap_err();
        assert!(matches!(why, CgroupUnknown::Exited(p) if p == pid), "{why}");
        assert!(why.to_string().contains("exited before"), "{why}");
        // A live peer (this very process, connected to itself) is read as usual.
        let _me = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let pid = stream.peer_cred().unwrap().pid().unwrap();
        assert_eq!(pid, std::process::id() as i32);
        assert!(cgroup_of_peer(&stream, pid, &Procfs::default()).is_ok());
    }

    /// Issue 41, on the worker API's unix socket: 200 connections of one container (this
    /// process) that never finish a head, and that same peer's real request is still served:
    /// its own idle-longest connection gives way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_s_real_request_is_served_while_its_own_junk_holds_the_socket() {
        use super::{serve_router, Limits, UnixPeers};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/worker.sock");
        let listener = bind_unix(&path).unwrap();
        let app = axum::Router::new().route("/ping", axum::routing::get(|| async { "pong" }));
        let stop = tokio_util::sync::CancellationToken::new();
        let limits = Limits {
            header_timeout: std::time::Duration::from_secs(60),
            max_head: 32 * 1024,
            max_connections: 128,
            per_peer: 32,
            max_age: std::time::Duration::from_secs(60),
        };
        let peers = UnixPeers { listener, procfs: Procfs::default() };
        tokio::spawn(serve_router(peers, app, stop.clone(), limits));
        let mut junk = Vec::new();
        for _ in 0..200 {
            let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
            let _ = c.write_all(b"PUT /v1/workers/w/status HTTP/1.1\r\n").await;
            junk.push(c);
        }
        for _ in 0..5 {
            let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
            c.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut out = String::new();
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(20),
                c.read_to_string(&mut out),
            )
            .await;
            assert!(read.is_ok(), "no answer while junk holds the socket");
            assert!(out.contains("pong"), "{out}");
        }
        // The junk was closed as it gave way: most of it reads end-of-file now, or a reset.
        // NB: a connection evicted before the server read its partial head is closed with
        // unread data, which a unix socket reports to its peer as ECONNRESET, not end-of-file
        // (on a loaded machine many are); all are read at once, each within 5 s, since the
        // server drops an evicted connection only when its task next runs.
        let reads = junk.iter_mut().map(|c| async move {
            let mut b = [0u8; 1];
            match tokio::time::timeout(std::time::Duration::from_secs(5), c.read(&mut b)).await {
                Ok(Ok(0)) => true,
                Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionReset,
                _ => false,
            }
        });
        let closed =
            futures_util::future::join_all(reads).await.into_iter().filter(|&eof| eof).count();
        assert!(closed >= 200 - 32, "only {closed} of the junk connections were closed");
        stop.cancel();
    }

    #[test]
    fn a_stale_socket_or_a_stray_file_is_replaced_and_nothing_else_is_touched() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run/vigil");
        let path = run.join("worker.sock");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            drop(bind_unix(&path).unwrap());
            // The socket file outlives its listener; a second start replaces it.
            assert!(path.exists());
            bind_unix(&path).unwrap();
            // A file left where the socket goes no longer stops a start.
            std::fs::remove_file(&path).unwrap();
            std::fs::write(&path, "x").unwrap();
            bind_unix(&path).unwrap();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            assert!(meta.file_type().is_socket());
            assert_eq!(meta.permissions().mode() & 0o777, 0o666);
            // A symlink there aims the chmod at nothing: the link is replaced, its target kept.
            let host_file = dir.path().join("host-file");
            std::fs::write(&host_file, "secret").unwrap();
            std::fs::set_permissions(&host_file, std::fs::Permissions::from_mode(0o600)).unwrap();
            std::fs::remove_file(&path).unwrap();
            std::os::unix::fs::symlink(&host_file, &path).unwrap();
            bind_unix(&path).unwrap();
            let host = std::fs::metadata(&host_file).unwrap();
            assert_eq!(host.permissions().mode() & 0o777, 0o600);
            assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_socket());
            // No staging directory is left behind.
            let left: Vec<_> = std::fs::read_dir(&run).unwrap().collect();
            assert_eq!(left.len(), 1, "{left:?}");
            // A directory in the way, and a directory others may write, are refused.
            let taken = run.join("dir.sock");
            std::fs::create_dir(&taken).unwrap();
            assert!(bind_unix(&taken).is_err());
            let open = dir.path().join("open");
            std::fs::create_dir(&open).unwrap();
            std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
            let err = bind_unix(&open.join("worker.sock")).unwrap_err();
            assert!(err.to_string().contains("writable by group or others"), "{err}");
        });
    }
}
