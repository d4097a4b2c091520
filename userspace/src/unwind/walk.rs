//! The table-driven stack walk, in plain Rust: the algorithm the eBPF sampler is to run,
//! step for step (same bounds, same fallbacks, same stop reasons), and its test oracle.
//!
//! Per frame: find the mapping holding the PC, binary-search its rows at `pc - bias` (the
//! return address minus one for caller frames, since a call may be a function's last
//! instruction), compute the CFA, read the return address at CFA-8 and the caller's rbp
//! where the row says it was saved. Where no row covers the PC, one frame-pointer step
//! (`[rbp]`, `[rbp+8]`) is taken instead.

use super::process::{MappingEntry, RowArena, find_row};
use super::{unwind_kind, unwind_reg};

/// Reads the walked process's memory; `None` is a fault.
pub trait Memory {
    /// The 8 bytes at `addr`, or `None` where the read faults.
    fn read_u64(&self, addr: u64) -> Option<u64>;
}

/// The registers the walk starts from (the sampled `pt_regs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    /// Instruction pointer (rip).
    pub pc: u64,
    /// Stack pointer (rsp).
    pub sp: u64,
    /// Frame pointer (rbp).
    pub bp: u64,
}

/// Why a walk stopped; the eBPF side counts each in a per-CPU counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A row with an undefined return address (`_start`, `clone3`), or a zero one.
    EndOfStack,
    /// No row and no usable frame pointer.
    NoTable,
    /// The CFA or frame pointer did not move up the stack.
    BadCfa,
    /// A rule the walker cannot follow (expression, signal frame).
    Unsupported,
    /// Reading the stack faulted.
    ReadFault,
    /// `max_depth` frames were taken.
    DepthLimit,
}

/// A walked stack, innermost first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Walk {
    /// Program counters, innermost first.
    pub pcs: Vec<u64>,
    /// Frames unwound with a table row.
    pub dwarf_steps: u32,
    /// Frames unwound with the frame pointer.
    pub fp_steps: u32,
    /// Why the walk stopped.
    pub stop: Stop,
}

/// Walks from `regs` through `mappings` (sorted by start) and `arena`, at most `max_depth`
/// frames.
pub fn walk(
    regs: Regs,
    mappings: &[MappingEntry],
    arena: &RowArena,
    mem: &impl Memory,
    max_depth: usize,
) -> Walk {
    let Regs {
        mut pc,
        mut sp,
        mut bp,
    } = regs;
    let mut w = Walk {
        pcs: Vec::new(),
        dwarf_steps: 0,
        fp_steps: 0,
        stop: Stop::DepthLimit,
    };
    for depth in 0..max_depth {
        w.pcs.push(pc);
        let lookup = if depth == 0 { pc } else { pc.wrapping_sub(1) };
        let row = mappings
            .iter()
            .find(|m| m.start <= pc && pc < m.end)
            .and_then(|m| find_row(arena.slice(m), lookup.wrapping_sub(m.bias)));
        let step = match row {
            None => {
                w.fp_steps += 1;
                fp_step(sp, bp, mem)
            }
            Some(r) => {
                w.dwarf_steps += 1;
                let cfa = match (r.kind, r.cfa_reg) {
                    (unwind_kind::END_OF_STACK, _) => Err(Stop::EndOfStack),
                    (unwind_kind::PLT, _) => Ok(sp + 8 + if pc & 15 >= 11 { 8 } else { 0 }),
                    (unwind_kind::NORMAL, unwind_reg::RSP) => {
                        Ok(sp.wrapping_add_signed(r.cfa_offset.into()))
                    }
                    (unwind_kind::NORMAL, unwind_reg::RBP) => {
                        Ok(bp.wrapping_add_signed(r.cfa_offset.into()))
                    }
                    _ => Err(Stop::Unsupported),
                };
                cfa.and_then(|cfa| {
                    let saved_bp = (r.kind == unwind_kind::NORMAL && r.rbp_offset != 0)
                        .then(|| cfa.wrapping_add_signed(r.rbp_offset.into()));
                    cfa_step(cfa, sp, bp, saved_bp, mem)
                })
            }
        };
        match step {
            Ok((0, _, _)) => {
                w.stop = Stop::EndOfStack;
                return w;
            }
            Ok((npc, nsp, nbp)) => (pc, sp, bp) = (npc, nsp, nbp),
            Err(stop) => {
                w.stop = stop;
                return w;
            }
        }
    }
    w
}

/// The caller's (pc, sp, bp) from a CFA; the CFA must lie above the current sp.
fn cfa_step(
    cfa: u64,
    sp: u64,
    bp: u64,
    saved_bp: Option<u64>,
    mem: &impl Memory,
) -> Result<(u64, u64, u64), Stop> {
    if cfa <= sp {
        return Err(Stop::BadCfa);
    }
    let ra = mem.read_u64(cfa - 8).ok_or(Stop::ReadFault)?;
    let bp = match saved_bp {
        Some(at) => mem.read_u64(at).ok_or(Stop::ReadFault)?,
        None => bp,
    };
    Ok((ra, cfa, bp))
}

/// One frame-pointer step: the frame record at rbp is (caller's rbp, return address).
fn fp_step(sp: u64, bp: u64, mem: &impl Memory) -> Result<(u64, u64, u64), Stop> {
    if bp == 0 {
        return Err(Stop::NoTable);
    }
    if bp < sp {
        return Err(Stop::BadCfa);
    }
    let ra = mem.read_u64(bp + 8).ok_or(Stop::ReadFault)?;
    let caller_bp = mem.read_u64(bp).ok_or(Stop::ReadFault)?;
    Ok((ra, bp + 16, caller_bp))
}
