//! The agent's side: a Unix socket that hands every client the newest frame, then each new
//! one. One thread accepts; one thread per client (at most [`MAX_CLIENTS`]) writes. A slow
//! client skips frames rather than queueing them, so memory stays one frame however many
//! clients lag; a client that stops reading for [`WRITE_TIMEOUT`] is dropped. Clients are
//! never read from.

use std::{
    io::Write as _,
    os::unix::{
        fs::{FileTypeExt as _, PermissionsExt as _},
        net::{UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
    sync::{
        Arc, Condvar, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::Duration,
};

use super::{GROUP, RemoteError, encode};
use crate::tui::Snapshot;

/// Clients served at once; more are refused (closed on accept).
pub const MAX_CLIENTS: usize = 64;

/// How long a write to a client may block before the client is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Latest {
    seq: u64,
    frame: Arc<Vec<u8>>,
}

struct Shared {
    latest: Mutex<Latest>,
    fresh: Condvar,
    clients: AtomicUsize,
    stop: AtomicBool,
}

/// A listening socket that publishes frames.
pub struct Server {
    path: PathBuf,
    shared: Arc<Shared>,
}

impl Server {
    /// Binds `path` (creating its directory, mode 0755, when missing) and starts accepting.
    /// A stale socket left by a killed agent is replaced; a live one is an error.
    pub fn bind(path: &Path) -> Result<Self, RemoteError> {
        let io = |what, source| RemoteError::Io {
            what,
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && !d.exists())
        {
            std::fs::create_dir_all(dir).map_err(|e| io("cannot create the directory of", e))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| io("cannot set the mode of the directory of", e))?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(RemoteError::NotASocket {
                    path: path.to_path_buf(),
                });
            }
            Ok(_) if UnixStream::connect(path).is_ok() => {
                return Err(RemoteError::InUse {
                    path: path.to_path_buf(),
                });
            }
            Ok(_) => {
                std::fs::remove_file(path).map_err(|e| io("cannot remove the stale socket", e))?
            }
            Err(_) => {}
        }
        // Created 0600 (umask) so no one can connect before the mode below is set.
        // SAFETY: umask only changes this process's file-creation mask; restored at once.
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(path);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let listener = bound.map_err(|e| io("cannot listen on", e))?;
        restrict(path).map_err(|e| io("cannot set the owner and mode of", e))?;
        let shared = Arc::new(Shared {
            latest: Mutex::new(Latest::default()),
            fresh: Condvar::new(),
            clients: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let accept = Arc::clone(&shared);
        thread::Builder::new()
            .name("energy-bpf-socket".into())
            .spawn(move || accept_loop(&listener, &accept))
            .map_err(|e| io("cannot start the thread serving", e))?;
        Ok(Self {
            path: path.to_path_buf(),
            shared,
        })
    }

    /// Sends `snapshot` to every client (each gets it, or a newer one if it lags).
    pub fn publish(&self, snapshot: &Snapshot) {
        let frame = Arc::new(encode(snapshot));
        let mut latest = self
            .shared
            .latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        latest.seq += 1;
        latest.frame = frame;
        self.shared.fresh.notify_all();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.fresh.notify_all();
        let _ = std::fs::remove_file(&self.path);
        // Wake the accept loop so it sees `stop`.
        let _ = UnixStream::connect(&self.path);
    }
}

/// Group `energy-bpf` and 0660 when the group exists, else 0600.
fn restrict(path: &Path) -> std::io::Result<()> {
    match group_id(GROUP) {
        Some(gid) => match std::os::unix::fs::chown(path, None, Some(gid)) {
            Ok(()) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)),
            // Not root nor in the group (an agent running as a service user without
            // CAP_CHOWN): the socket stays this user's alone.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                tracing::warn!(
                    "cannot give {} to group {GROUP} ({e}); only this user can connect",
                    path.display()
                );
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            }
            Err(e) => Err(e),
        },
        None => std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)),
    }
}

fn group_id(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: getgrnam reads the group database; the returned pointer is valid until the
    // next getgr* call on this thread, and only gr_gid is read, at once.
    let group = unsafe { libc::getgrnam(name.as_ptr()) };
    // SAFETY: non-null pointers from getgrnam point at a valid `group`.
    (!group.is_null()).then(|| unsafe { (*group).gr_gid })
}

fn accept_loop(listener: &UnixListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(stream) = stream else {
            continue;
        };
        if shared.clients.load(Ordering::Relaxed) >= MAX_CLIENTS {
            tracing::warn!("refusing a socket client: {MAX_CLIENTS} already connected");
            continue;
        }
        shared.clients.fetch_add(1, Ordering::Relaxed);
        let client = Arc::clone(shared);
        let spawned = thread::Builder::new()
            .name("energy-bpf-client".into())
            .spawn(move || {
                serve(stream, &client);
                client.clients.fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            shared.clients.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn serve(mut stream: UnixStream, shared: &Shared) {
    // Never read from a client: the stream is one-way.
    let _ = stream.shutdown(std::net::Shutdown::Read);
    if stream.set_write_timeout(Some(WRITE_TIMEOUT)).is_err() {
        return;
    }
    let mut sent = 0u64;
    loop {
        let frame = {
            let mut latest = shared.latest.lock().unwrap_or_else(PoisonError::into_inner);
            while latest.seq == sent && !shared.stop.load(Ordering::Relaxed) {
                latest = shared
                    .fresh
                    .wait(latest)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
            sent = latest.seq;
            Arc::clone(&latest.frame)
        };
        if stream.write_all(&frame).is_err() {
            return;
        }
    }
}
