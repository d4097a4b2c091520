//! `top`'s side: connect, then turn each frame into a [`Snapshot`] on a reader thread.

use std::{
    io::{ErrorKind, Read},
    os::unix::net::UnixStream,
    path::Path,
    sync::mpsc::{self, Receiver},
    thread,
};

use super::{MAX_FRAME_BYTES, RemoteError, decode};
use crate::tui::Snapshot;

/// Connects to the agent at `path` and returns the snapshot channel. Errors say whether no
/// agent runs there or this user may not read it. The channel closes when the agent goes
/// away or sends something that is not a frame (said on stderr).
pub fn connect(path: &Path) -> Result<Receiver<Snapshot>, RemoteError> {
    let stream = UnixStream::connect(path).map_err(|source| match source.kind() {
        ErrorKind::NotFound | ErrorKind::ConnectionRefused => RemoteError::NoAgent {
            path: path.to_path_buf(),
        },
        ErrorKind::PermissionDenied => RemoteError::Permission {
            path: path.to_path_buf(),
        },
        _ => RemoteError::Io {
            what: "cannot connect to",
            path: path.to_path_buf(),
            source,
        },
    })?;
    let (tx, rx) = mpsc::channel();
    let shown = path.display().to_string();
    thread::Builder::new()
        .name("energy-bpf-connect".into())
        .spawn(move || {
            let mut stream = std::io::BufReader::new(stream);
            loop {
                match read_frame(&mut stream) {
                    Ok(Some(snapshot)) => {
                        if tx.send(snapshot).is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        eprintln!("energy-bpf: the agent at {shown} closed the connection");
                        return;
                    }
                    Err(err) => {
                        eprintln!("energy-bpf: {err}");
                        return;
                    }
                }
            }
        })
        .map_err(|source| RemoteError::Io {
            what: "cannot start the reader of",
            path: path.to_path_buf(),
            source,
        })?;
    Ok(rx)
}

/// Reads one length-delimited frame; `None` at a clean end of stream.
pub fn read_frame(r: &mut impl Read) -> Result<Option<Snapshot>, RemoteError> {
    let io = |source| RemoteError::Io {
        what: "cannot read from",
        path: "the agent's socket".into(),
        source,
    };
    // A varint of at most 10 bytes.
    let mut len: u64 = 0;
    for i in 0..10 {
        let mut byte = [0u8];
        match r.read_exact(&mut byte) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof && i == 0 => return Ok(None),
            Err(e) => return Err(io(e)),
        }
        len |= u64::from(byte[0] & 0x7f) << (7 * i);
        if byte[0] & 0x80 == 0 {
            break;
        }
        if i == 9 {
            return Err(RemoteError::BadFrame {
                why: "length prefix longer than 10 bytes",
            });
        }
    }
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len > MAX_FRAME_BYTES {
        return Err(RemoteError::FrameTooLarge { len });
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).map_err(io)?;
    decode(&buf).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::{Server, encode};

    #[test]
    fn frames_read_back_and_bad_lengths_are_refused() {
        let snap = crate::tui::fixtures::snapshot(false);
        let mut bytes = encode(&snap);
        bytes.extend(encode(&snap));
        let mut r = bytes.as_slice();
        assert_eq!(
            read_frame(&mut r).expect("first").expect("frame").rows,
            snap.rows
        );
        assert!(read_frame(&mut r).expect("second").is_some());
        assert!(read_frame(&mut r).expect("clean end").is_none());
        // 1 GiB announced: refused before allocating.
        let mut huge: &[u8] = &[0x80, 0x80, 0x80, 0x80, 0x04];
        assert!(matches!(
            read_frame(&mut huge),
            Err(RemoteError::FrameTooLarge { .. })
        ));
        let mut cut: &[u8] = &[0x05, 1, 2];
        assert!(read_frame(&mut cut).is_err());
    }

    #[test]
    fn a_client_sees_published_snapshots_and_the_socket_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("run").join("agent.sock");
        let server = Server::bind(&path).expect("bind");
        let mode = std::fs::metadata(&path)
            .expect("socket")
            .permissions()
            .mode()
            & 0o777;
        assert!(mode == 0o600 || mode == 0o660, "mode {mode:o}");
        assert!(matches!(
            Server::bind(&path),
            Err(RemoteError::InUse { .. })
        ));
        let rx = connect(&path).expect("connect");
        let mut snap = crate::tui::fixtures::snapshot(true);
        // The client may connect after the first publish; publish until it sees one.
        for i in 0..50u64 {
            snap.ts_ns = 1_000 + i;
            server.publish(&snap);
            if let Ok(got) = rx.recv_timeout(std::time::Duration::from_millis(100)) {
                assert_eq!(got.rows, snap.rows);
                assert!(got.header.estimated);
                drop(server);
                assert!(!path.exists(), "the socket is removed on shutdown");
                return;
            }
        }
        panic!("no snapshot reached the client");
    }

    #[test]
    fn no_agent_and_stale_sockets_are_told_apart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.sock");
        assert!(matches!(connect(&path), Err(RemoteError::NoAgent { .. })));
        // A socket file nobody listens on (a killed agent) is replaced by a new bind.
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
        assert!(path.exists());
        assert!(matches!(connect(&path), Err(RemoteError::NoAgent { .. })));
        let _server = Server::bind(&path).expect("stale socket replaced");
        std::fs::write(dir.path().join("file"), b"x").expect("write");
        assert!(matches!(
            Server::bind(&dir.path().join("file")),
            Err(RemoteError::NotASocket { .. })
        ));
    }
}
