//! Struct member offsets from the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Rust eBPF has no CO-RE field relocations, so the probes cannot name `task_struct::pid`.
//! We read the offsets here and hand them to the probes as globals before load
//! (docs/ARCHITECTURE.md, "Our machines"). Only the BTF type section is walked; the format is the kernel's
//! `include/uapi/linux/btf.h`.

use std::path::Path;

/// Why an offset could not be found.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file could not be read.
    #[error(
        "cannot read kernel BTF at {path}: {source} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)"
    )]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The bytes are not BTF.
    #[error("{0}")]
    Malformed(&'static str),
    /// The struct or member does not exist in this kernel.
    #[error("no member {member} in struct {ty} in kernel BTF")]
    Missing {
        /// Struct name.
        ty: String,
        /// Member name.
        member: String,
    },
}

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;

/// Byte offsets of the named members of a struct in raw BTF.
pub fn member_offsets(btf: &[u8], ty: &str, members: &[&str]) -> Result<Vec<u32>, BtfError> {
    let u16_at = |o: usize| btf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        btf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if u16_at(0) != Some(BTF_MAGIC) {
        return Err(BtfError::Malformed("not little-endian BTF (bad magic)"));
    }
    let hdr = |i: usize| u32_at(4 + 4 * i).ok_or(BtfError::Malformed("short BTF header"));
    let (hdr_len, type_off, type_len, str_off) = (
        hdr(0)? as usize,
        hdr(1)? as usize,
        hdr(2)? as usize,
        hdr(3)? as usize,
    );
    let types = hdr_len + type_off;
    let strings = hdr_len + str_off;
    let name = |off: u32| -> &[u8] {
        let start = strings + off as usize;
        let rest = btf.get(start..).unwrap_or(&[]);
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    };
    let mut at = types;
    let end = types + type_len;
    while at + 12 <= end {
        let (name_off, info) = (u32_at(at).unwrap_or(0), u32_at(at + 4).unwrap_or(0));
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let kind_flag = info >> 31 == 1;
        let body = at + 12;
        if kind == KIND_STRUCT && name(name_off) == ty.as_bytes() {
            return members
                .iter()
                .map(|want| {
                    (0..vlen)
                        .find_map(|i| {
                            let m = body + 12 * i;
                            (name(u32_at(m)?) == want.as_bytes()).then(|| {
                                let bits = u32_at(m + 8).unwrap_or(0);
                                let bits = if kind_flag { bits & 0x00ff_ffff } else { bits };
                                bits / 8
                            })
                        })
                        .ok_or_else(|| BtfError::Missing {
                            ty: ty.into(),
                            member: (*want).into(),
                        })
                })
                .collect();
        }
        // Skip the kind-specific data that follows each btf_type.
        at = body
            + match kind {
                1 | 14 | 17 => 4,          // INT, VAR, DECL_TAG
                3 => 12,                   // ARRAY
                4 | 5 => 12 * vlen,        // STRUCT, UNION
                6 => 8 * vlen,             // ENUM
                13 => 8 * vlen,            // FUNC_PROTO
                15 => 12 * vlen,           // DATASEC
                19 => 12 * vlen,           // ENUM64
                2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
                _ => return Err(BtfError::Malformed("unknown BTF kind")),
            };
    }
    Err(BtfError::Missing {
        ty: ty.into(),
        member: members.join(","),
    })
}

/// `task_struct::pid` and `::tgid` offsets of the running kernel.
pub(crate) fn task_pid_offsets(vmlinux: &Path) -> Result<(u32, u32), BtfError> {
    let btf = std::fs::read(vmlinux).map_err(|source| BtfError::Read {
        path: vmlinux.display().to_string(),
        source,
    })?;
    match member_offsets(&btf, "task_struct", &["pid", "tgid"])?.as_slice() {
        [pid, tgid] => Ok((*pid, *tgid)),
        _ => Err(BtfError::Malformed(
            "member lookup returned the wrong count",
        )),
    }
}

/// Offset of `task_struct::thread.fsbase` (x86_64): where the kernel keeps a thread's
/// thread pointer, which glibc's `pthread_self()` returns.
pub(crate) fn task_fsbase_offset(vmlinux: &Path) -> Result<u32, BtfError> {
    let btf = std::fs::read(vmlinux).map_err(|source| BtfError::Read {
        path: vmlinux.display().to_string(),
        source,
    })?;
    let thread = member_offsets(&btf, "task_struct", &["thread"])?;
    let fsbase = member_offsets(&btf, "thread_struct", &["fsbase"])?;
    match (thread.as_slice(), fsbase.as_slice()) {
        ([t], [f]) => Ok(t + f),
        _ => Err(BtfError::Malformed(
            "member lookup returned the wrong count",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_kernel_task_struct_offsets_are_plausible() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("skipping: {} absent (kernel without BTF)", path.display());
            return;
        }
        let (pid, tgid) = task_pid_offsets(path).expect("task_struct offsets");
        // pid_t pid; pid_t tgid; are adjacent members deep inside task_struct.
        assert_eq!(tgid, pid + 4, "tgid follows pid");
        assert!(pid > 100 && pid < 16384, "pid offset {pid} implausible");
    }

    #[test]
    fn running_kernel_fsbase_offset_is_plausible() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("skipping: {} absent (kernel without BTF)", path.display());
            return;
        }
        let fsbase = task_fsbase_offset(path).expect("thread.fsbase offset");
        let (pid, _) = task_pid_offsets(path).expect("task_struct offsets");
        // `thread` is the last member of task_struct, after pid.
        assert!(
            fsbase > pid && fsbase < 65536,
            "fsbase offset {fsbase} implausible"
        );
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let err = member_offsets(b"not btf at all", "task_struct", &["pid"]).expect_err("garbage");
        assert!(err.to_string().contains("bad magic"), "{err}");
    }
}
