//! Window snapshots over the agent's Unix socket: the privilege split that lets people
//! without root watch `top`.
//!
//! The agent (root, or CAP_BPF+CAP_PERFMON) captures and publishes one frame per window
//! (`Server`); `energy-bpf top --connect PATH`, or `top` run without root, reads them
//! ([`connect`]) and shows them in the same view. The socket is one-way and carries only
//! what `top` shows (`proto/agent.proto`). It is mode 0660 with group `energy-bpf` when
//! that group exists, else 0600: file permissions are the authentication.

mod client;
mod convert;
mod server;

pub use client::{connect, read_frame};
pub use convert::{MAX_FRAME_BYTES, decode, encode};
pub(crate) use server::Server;

use std::path::PathBuf;

/// Where the agent's socket is unless told otherwise (systemd's `RuntimeDirectory`).
pub(crate) const DEFAULT_SOCKET: &str = "/run/energy-bpf/agent.sock";

/// Group whose members may read the socket.
pub(crate) const GROUP: &str = "energy-bpf";

/// What can go wrong on either end of the socket.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// No agent is listening there.
    #[error(
        "no energy-bpf agent at {path}: run `sudo energy-bpf top` to capture directly, or start the agent (`sudo systemctl start energy-bpf-agent`, or `sudo energy-bpf agent`)"
    )]
    NoAgent {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket exists but this user may not open it.
    #[error(
        "permission denied: {path} is readable by root and the `{GROUP}` group only; ask an admin to add you (`sudo usermod -aG {GROUP} $USER`, then log in again), or run `sudo energy-bpf top`"
    )]
    Permission {
        /// The socket path.
        path: PathBuf,
    },
    /// Another process already serves this path.
    #[error("{path} is in use by another running agent; stop it or pass another --socket")]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// Something that is not a socket sits at the path.
    #[error("{path} exists and is not a socket; remove it or pass another --socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Any other I/O failure.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A frame longer than [`MAX_FRAME_BYTES`].
    #[error("the agent sent a frame of {len} bytes, more than the {MAX_FRAME_BYTES} accepted")]
    FrameTooLarge {
        /// Its length.
        len: usize,
    },
    /// Bytes that are not a frame.
    #[error("the agent sent bytes that are not a frame: {source}")]
    Decode {
        /// The protobuf error.
        source: prost::DecodeError,
    },
    /// A frame that decodes but cannot be a window.
    #[error("the agent sent an impossible frame: {why}")]
    BadFrame {
        /// Why.
        why: &'static str,
    },
}
