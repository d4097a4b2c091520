//! Tests of `capture::unwinder`'s request policy.
use super::*;
use energy_bpf_abi::unwind_flags;
use energy_bpf_abi::unwind_method;

const NO_TABLES: u32 = unwind_method::FP | (unwind_stop::NO_PROCESS << 8);
const WALKED: u32 = unwind_method::DWARF | (unwind_stop::END_OF_STACK << 8);

#[test]
fn asks_once_per_process_until_dropped() {
    let mut p = Policy::default();
    assert_eq!(p.on_sample(7, NO_TABLES, || 0), Some(Request::Load(7)));
    assert_eq!(p.on_sample(7, NO_TABLES, || 0), None, "asked already");
    assert_eq!(p.on_sample(8, NO_TABLES, || 0), Some(Request::Load(8)));
    assert_eq!(
        p.on_sample(7, WALKED, || 0),
        None,
        "a whole walk needs nothing"
    );
    assert_eq!(p.forget(7), Request::Drop(7));
    assert_eq!(
        p.on_sample(7, NO_TABLES, || 0),
        Some(Request::Load(7)),
        "a new program"
    );
}

#[test]
fn exec_drops_then_loads_and_is_not_asked_again() {
    let mut p = Policy::default();
    assert_eq!(p.exec(9, 0), [Request::Drop(9), Request::Load(9)]);
    assert_eq!(p.on_sample(9, NO_TABLES, || 0), None);
}

#[test]
fn an_exec_drained_after_the_new_programs_tables_were_asked_for_keeps_them() {
    let mut p = Policy::default();
    // Asked for at 200 (a sample of the new program), exec event at 150 drained later.
    assert_eq!(p.on_sample(4, NO_TABLES, || 200), Some(Request::Load(4)));
    assert!(
        p.on_exec(4, 150, true, 300).is_empty(),
        "tables of the new program"
    );
    assert_eq!(p.on_sample(4, NO_TABLES, || 310), None, "still asked for");
    // An exec after the request: the tables describe the old program.
    assert_eq!(
        p.on_exec(4, 250, false, 320),
        vec![Request::Drop(4)],
        "old program, not an explicit target"
    );
    assert_eq!(p.on_sample(4, NO_TABLES, || 330), Some(Request::Load(4)));
    assert_eq!(
        p.on_exec(4, 400, true, 410),
        vec![Request::Drop(4), Request::Load(4)],
        "an explicit target is reloaded at once"
    );
    assert!(p.on_exec(4, 405, true, 420).is_empty(), "reloaded after it");
}

#[test]
fn unmapped_pcs_ask_nothing_of_the_policy() {
    // The session re-reads the mappings and asks for a reload only when they changed.
    let mut p = Policy::default();
    let unmapped = WALKED | unwind_flags::UNMAPPED_PC;
    assert_eq!(p.on_sample(5, unmapped, || 0), None);
}

#[test]
fn prune_forgets_processes_that_are_gone() {
    let mut p = Policy::default();
    for t in [1, 2, 3] {
        p.on_sample(t, NO_TABLES, || 0);
    }
    p.prune(|t| t == 2);
    assert_eq!(
        p.on_sample(1, NO_TABLES, || 0),
        Some(Request::Load(1)),
        "pruned"
    );
    assert_eq!(
        p.on_sample(2, NO_TABLES, || 0),
        None,
        "still alive, still asked"
    );
}

#[test]
fn requests_are_bounded() {
    let mut p = Policy::default();
    let asked = (0..5 * MAX_PROCESSES as u32)
        .filter(|&t| p.on_sample(t, NO_TABLES, || 0).is_some())
        .count();
    assert_eq!(asked, 4 * MAX_PROCESSES);
}
