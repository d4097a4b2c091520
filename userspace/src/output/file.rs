//! Creating output files (recordings, flamegraphs, profiles) so that they are readable by
//! their owner only, also when the file already existed, and never through a symbolic
//! link someone planted at the path in a shared directory such as /tmp.

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

/// Why an output file could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The path is a symbolic link; following it could overwrite any file we may write.
    #[error(
        "refusing to write {path}: it is a symbolic link (remove it, or write to the file it points to directly)"
    )]
    Symlink {
        /// The path given.
        path: PathBuf,
    },
    /// Opening or tightening the mode failed.
    #[error("cannot create {path}: {source}")]
    Io {
        /// The path given.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Refuses `path` early when it is a symbolic link, before a command spends time starting
/// up (probes, counters) only to be refused by [`create_private`], which still decides
/// (`O_NOFOLLOW`: a link planted after this check is refused there too).
pub fn refuse_symlink(path: &Path) -> Result<(), CreateError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            Err(CreateError::Symlink { path: path.into() })
        }
        _ => Ok(()),
    }
}

/// Creates or truncates `path` for writing with mode 0600. An existing regular file is
/// tightened to 0600 too (the mode given to open applies only at creation); a device or
/// pipe (`/dev/null`, `/dev/stdout`) is written as is, its mode untouched.
pub fn create_private(path: &Path) -> Result<File, CreateError> {
    let io = |source| CreateError::Io {
        path: path.into(),
        source,
    };
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                CreateError::Symlink { path: path.into() }
            } else {
                io(e)
            }
        })?;
    let meta = file.metadata().map_err(io)?;
    if meta.is_file() && meta.permissions().mode() & 0o7777 != 0o600 {
        // fchmod on the open file: no window in which another path is changed.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io)?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777
    }

    #[test]
    fn new_and_existing_files_end_up_private_and_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let new = dir.path().join("new");
        drop(create_private(&new).expect("create"));
        assert_eq!(mode(&new), 0o600);
        let old = dir.path().join("old");
        std::fs::write(&old, "old contents").expect("write");
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        drop(create_private(&old).expect("create"));
        assert_eq!(mode(&old), 0o600);
        assert_eq!(std::fs::read(&old).expect("read"), b"");
    }

    #[test]
    fn a_planted_symlink_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("victim");
        std::fs::write(&target, "precious").expect("write");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let link = dir.path().join("out.ebpr");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let err = create_private(&link).expect_err("symlink");
        assert!(matches!(err, CreateError::Symlink { .. }), "{err}");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read(&target).expect("read"), b"precious");
        assert_eq!(mode(&target), 0o644);
    }

    #[test]
    fn devices_keep_their_mode() {
        let before = mode(Path::new("/dev/null"));
        drop(create_private(Path::new("/dev/null")).expect("open /dev/null"));
        assert_eq!(mode(Path::new("/dev/null")), before);
    }
}
