//! The user-stack table walker: [`walk_user`], tail-called by `sample_stack` and by itself,
//! four frames per program (docs/ARCHITECTURE.md, "Capture").

use super::*;

/// The table walk: [`FRAMES_PER_PROGRAM`] frames, then a tail call to itself with the
/// walk's registers in [`WALK_STATE`], until the stack ends; then it sends the sample that
/// [`sample_stack`] started. Only ever entered by tail call.
///
/// Per frame (docs/ARCHITECTURE.md, "Capture", and `unwind::walk`, its reference): find
/// the mapping holding the PC, binary-search its rows at `pc - bias` (the return address
/// minus one for caller frames), compute the CFA, read the return address at CFA-8 and the
/// caller's rbp where the row saved it. Where no row covers the PC, one frame-pointer step.
#[perf_event]
pub fn walk_user(ctx: PerfEventContext) -> u32 {
    let (Some(st), Some(event)) = (WALK_STATE.get_ptr_mut(0), WALK_SAMPLE.get_ptr_mut(0)) else {
        return 0;
    };
    // SAFETY: this CPU's slots (see start_table_walk).
    let tgid = unsafe { (*event).tgid };
    // SAFETY: read-only use while the program runs; userspace replaces whole values.
    let Some(procs) = (unsafe { UNWIND_PROCS.get(&tgid) }) else {
        return finish_walk(&ctx, event, 0, unwind_stop::NO_PROCESS);
    };
    // SAFETY: as above.
    let WalkState {
        mut pc,
        mut sp,
        mut bp,
        depth,
        mut flags,
    } = unsafe { core::ptr::read(st) };
    let mut depth = depth as usize;
    let count = procs.count as usize;
    let mut stop = CONTINUE;
    for _ in 0..FRAMES_PER_PROGRAM {
        if depth >= MAX_STACK_DEPTH {
            stop = unwind_stop::DEPTH_LIMIT;
            break;
        }
        // SAFETY: depth < MAX_STACK_DEPTH; this CPU's slot.
        unsafe { (*event).user_stack[depth] = pc };
        let lookup = if depth == 0 { pc } else { pc.wrapping_sub(1) };
        depth += 1;
        let mut row = None;
        let mut mapped = false;
        for i in 0..UNWIND_MAPPINGS {
            if i >= count {
                break;
            }
            let m = &procs.maps[i];
            if m.start <= pc && pc < m.end {
                mapped = true;
                row = find_row(m, lookup.wrapping_sub(m.bias));
                break;
            }
        }
        if !mapped {
            flags |= unwind_flags::UNMAPPED_PC;
        }
        let (cfa, saved_bp) = match row {
            Some(r) if r.kind == unwind_kind::NORMAL => {
                let base = if r.cfa_reg == unwind_reg::RBP { bp } else { sp };
                let cfa = base.wrapping_add(r.cfa_offset as i64 as u64);
                let saved =
                    (r.rbp_offset != 0).then(|| cfa.wrapping_add(r.rbp_offset as i64 as u64));
                (cfa, saved)
            }
            Some(r) if r.kind == unwind_kind::PLT => {
                (sp.wrapping_add(if pc & 15 >= 11 { 16 } else { 8 }), None)
            }
            Some(r) if r.kind == unwind_kind::END_OF_STACK => {
                stop = unwind_stop::END_OF_STACK;
                break;
            }
            Some(_) => {
                stop = unwind_stop::UNSUPPORTED;
                break;
            }
            None => {
                // One frame-pointer step: the frame record at rbp is (caller's rbp, return
                // address).
                if bp == 0 {
                    stop = unwind_stop::NO_TABLE;
                    break;
                }
                if bp < sp {
                    stop = unwind_stop::BAD_CFA;
                    break;
                }
                (bp.wrapping_add(16), Some(bp))
            }
        };
        if cfa <= sp {
            stop = unwind_stop::BAD_CFA;
            break;
        }
        let Some(ra) = read_user(cfa - 8) else {
            stop = unwind_stop::READ_FAULT;
            break;
        };
        if let Some(at) = saved_bp {
            let Some(v) = read_user(at) else {
                stop = unwind_stop::READ_FAULT;
                break;
            };
            bp = v;
        }
        sp = cfa;
        pc = ra;
        if pc == 0 {
            stop = unwind_stop::END_OF_STACK;
            break;
        }
    }
    if stop == CONTINUE {
        // SAFETY: this CPU's slot.
        unsafe {
            *st = WalkState {
                pc,
                sp,
                bp,
                depth: depth as u64,
                flags,
            };
            // Returns only when the call failed: past the kernel's 33 tail calls, which
            // MAX_STACK_DEPTH / FRAMES_PER_PROGRAM stays under.
            WALK_PROGS.tail_call(&ctx, WALK_USER);
        }
        stop = unwind_stop::DEPTH_LIMIT;
    }
    // SAFETY: this CPU's slot.
    unsafe { (*event).user_depth = depth as u32 };
    finish_walk(&ctx, event, flags, stop)
}

/// Hands the walked sample to the Python walker when its process is a CPython one, else
/// (or when that fails) sends it.
#[inline(always)]
fn finish_walk(ctx: &PerfEventContext, event: *mut SampleEvent, flags: u32, stop: u32) -> u32 {
    // SAFETY: this CPU's slot of WALK_SAMPLE, filled by start_table_walk and walk_user.
    unsafe {
        (*event).unwind = unwind_method::DWARF | ((stop & 0xff) << 8) | flags;
        if python::is_python((*event).tgid) {
            python::enter(ctx);
            (*event).py_stop = py_stop::TAIL_CALL;
        }
        if SAMPLES
            .output::<SampleEvent>(&*event, BPF_RB_NO_WAKEUP)
            .is_err()
        {
            bump(counter::SAMPLE_DROPPED);
        }
    }
    0
}

/// Not a stop reason: the walk goes on in the next program.
const CONTINUE: u32 = 0xff;

/// Frames one walker program takes. Four verify in ~0.3 s; eight exceed the verifier's
/// 1M-instruction budget (the nested mapping and row searches cannot be pruned), and four
/// times the kernel's 33 tail calls covers [`MAX_STACK_DEPTH`].
const FRAMES_PER_PROGRAM: usize = 4;

/// Binary-search steps over one file's rows: enough for [`UNWIND_ROWS`] rows.
const SEARCH_STEPS: usize = 21;

/// The row of `m`'s file covering `target` (an ELF virtual address), `None` in a gap.
#[inline(always)]
fn find_row(m: &UnwindMapping, target: u64) -> Option<UnwindRow> {
    let first = m.row_start;
    let mut lo = first;
    let mut hi = first.wrapping_add(m.row_count);
    for _ in 0..SEARCH_STEPS {
        if lo >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        let row = UNWIND_ROWS_MAP.get(mid)?;
        if row.pc <= target {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == first {
        return None;
    }
    let row = *UNWIND_ROWS_MAP.get(lo - 1)?;
    (u32::from(row.kind) != u32::from(unwind_kind::NO_INFO)).then_some(row)
}

#[inline(always)]
fn read_user(addr: u64) -> Option<u64> {
    // SAFETY: the helper checks the address and fails on a fault.
    unsafe { bpf_probe_read_user(addr as *const u64).ok() }
}
