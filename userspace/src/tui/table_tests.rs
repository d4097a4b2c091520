use super::*;
use crate::tui::fixtures::{four_processes, process};

fn ids(rows: &[TableRow]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

fn build(sort: Sort, filter: &str, grouping: Grouping, expanded: &[RowKey]) -> Vec<TableRow> {
    let expanded: BTreeSet<RowKey> = expanded.iter().cloned().collect();
    build_rows(
        &four_processes(),
        &ViewOptions {
            sort,
            filter,
            grouping,
            expanded: &expanded,
            pids: &[],
            carbon: None,
        },
    )
}

#[test]
fn every_column_sorts_in_its_natural_direction() {
    let cases = [
        (SortColumn::Power, ["300", "20", "4000", "1"]),
        (SortColumn::Energy, ["4000", "1", "20", "300"]),
        (SortColumn::Cpu, ["20", "4000", "300", "1"]),
        (SortColumn::Share, ["300", "20", "4000", "1"]),
        (SortColumn::Pid, ["1", "20", "300", "4000"]),
        (SortColumn::Command, ["4000", "20", "300", "1"]),
    ];
    for (column, expected) in cases {
        let rows = build(Sort::by(column), "", Grouping::Process, &[]);
        assert_eq!(ids(&rows), expected, "sorted by {column:?}");
    }
}

#[test]
fn reversed_sort_inverts_the_order() {
    let sort = Sort {
        column: SortColumn::Pid,
        descending: true,
    };
    let rows = build(sort, "", Grouping::Process, &[]);
    assert_eq!(ids(&rows), ["4000", "300", "20", "1"]);
}

#[test]
fn ties_fall_back_to_pid_order() {
    let rows = vec![
        process(9, "b", 1.0, 1.0, 1.0),
        process(3, "a", 1.0, 1.0, 1.0),
        process(5, "c", 1.0, 1.0, 1.0),
    ];
    let expanded = BTreeSet::new();
    let out = build_rows(
        &rows,
        &ViewOptions {
            sort: Sort::by(SortColumn::Power),
            filter: "",
            grouping: Grouping::Process,
            expanded: &expanded,
            pids: &[],
            carbon: None,
        },
    );
    assert_eq!(ids(&out), ["3", "5", "9"]);
}

#[test]
fn filter_matches_name_or_command_line_case_insensitively() {
    let rows = build(Sort::default(), "NGI", Grouping::Process, &[]);
    assert_eq!(ids(&rows), ["20"]);
    let rows = build(Sort::default(), "--run", Grouping::Process, &[]);
    assert_eq!(rows.len(), 4);
    let rows = build(Sort::default(), "no-such-thing", Grouping::Process, &[]);
    assert!(rows.is_empty());
}

#[test]
fn pid_list_limits_the_rows() {
    let expanded = BTreeSet::new();
    let out = build_rows(
        &four_processes(),
        &ViewOptions {
            sort: Sort::default(),
            filter: "",
            grouping: Grouping::Process,
            expanded: &expanded,
            pids: &[1, 4000],
            carbon: None,
        },
    );
    assert_eq!(ids(&out), ["4000", "1"]);
}

#[test]
fn expanded_process_shows_its_threads_sorted_below_it() {
    let rows = build(
        Sort::by(SortColumn::Power),
        "",
        Grouping::Process,
        &[RowKey::Process(300)],
    );
    assert_eq!(ids(&rows), ["300", "301", "302", "20", "4000", "1"]);
    assert!(rows[0].expandable && rows[0].expanded);
    assert_eq!(rows[1].depth, 1);
    assert_eq!(rows[1].command, "pg-writer");
    // A process without threads is not expandable even when asked.
    let rows = build(
        Sort::default(),
        "",
        Grouping::Process,
        &[RowKey::Process(1)],
    );
    assert_eq!(rows.len(), 4);
    assert!(!rows[3].expandable);
}

#[test]
fn cgroup_grouping_sums_members_and_expands_to_processes() {
    let docker = "/system.slice/docker-0123456789abcdef0123456789abcdef.scope";
    let rows = build(Sort::by(SortColumn::Power), "", Grouping::Cgroup, &[]);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].key, RowKey::Group(docker.to_string()));
    assert_eq!(rows[0].command, "docker:0123456789ab");
    assert_eq!(rows[0].id, "[2]");
    assert_eq!(rows[0].power_w, 28.0);
    assert_eq!(rows[0].energy_j, 35.0);
    assert_eq!(rows[0].cpu_pct, 130.0);
    assert_eq!(rows[1].command, "/user.slice");
    assert_eq!(rows[1].power_w, 2.5);

    let rows = build(
        Sort::by(SortColumn::Power),
        "",
        Grouping::Cgroup,
        &[RowKey::Group(docker.to_string()), RowKey::Process(300)],
    );
    assert_eq!(ids(&rows), ["[2]", "300", "301", "302", "20", "[2]"]);
    assert_eq!(rows[1].depth, 1);
    assert_eq!(rows[2].depth, 2);
}

#[test]
fn container_scopes_get_short_labels() {
    let cases = [
        (
            "/system.slice/docker-abcdef0123456789.scope",
            "docker:abcdef012345",
        ),
        (
            "/kubepods.slice/kubepods-pod1.slice/cri-containerd-99aabbccddeeff00.scope",
            "containerd:99aabbccddee",
        ),
        (
            "/machine.slice/libpod-0011223344556677.scope",
            "podman:001122334455",
        ),
        (
            "/kubepods.slice/kubepods-pod1.slice/crio-aabbccddeeff0011.scope",
            "crio:aabbccddeeff",
        ),
        ("/system.slice/sshd.service", "/system.slice/sshd.service"),
        (
            "/system.slice/docker-short.scope",
            "/system.slice/docker-short.scope",
        ),
        ("", "(unknown cgroup)"),
    ];
    for (path, label) in cases {
        assert_eq!(cgroup_label(path), label, "{path}");
    }
}

#[test]
fn sort_column_cycles_both_ways() {
    assert_eq!(SortColumn::Command.next(), SortColumn::Pid);
    assert_eq!(SortColumn::Pid.prev(), SortColumn::Command);
    assert_eq!(SortColumn::Power.next(), SortColumn::Energy);
    assert_eq!(SortColumn::Energy.prev(), SortColumn::Power);
}

#[test]
fn grams_follow_each_lines_energy_at_its_processes_rate() {
    // postgres (300) at 1 g/kJ, nginx (20) at 3 g/kJ, the others at the latest 2 g/kJ.
    let rates = CarbonRates {
        by_pid: HashMap::from([(300, 1e-3), (20, 3e-3)]),
        latest: 2e-3,
    };
    let expanded: BTreeSet<RowKey> = [
        RowKey::Process(300),
        RowKey::Group("/system.slice/docker-0123456789abcdef0123456789abcdef.scope".to_string()),
    ]
    .into_iter()
    .collect();
    let opts = |grouping| ViewOptions {
        sort: Sort::by(SortColumn::Pid),
        filter: "",
        grouping,
        expanded: &expanded,
        pids: &[],
        carbon: Some(&rates),
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    let rows = build_rows(&four_processes(), &opts(Grouping::Process));
    let grams = |key: RowKey| {
        let row = rows.iter().find(|r| r.key == key).expect("row");
        row.co2e_g.expect("grams")
    };
    assert!(close(grams(RowKey::Process(300)), 5.0 * 1e-3));
    assert!(close(grams(RowKey::Process(20)), 30.0 * 3e-3));
    assert!(close(grams(RowKey::Process(4000)), 500.0 * 2e-3));
    // A thread's energy at its process's rate.
    assert!(close(
        grams(RowKey::Thread { pid: 300, tid: 301 }),
        120.0 * 1e-3
    ));
    // A cgroup's grams are its members': postgres and nginx in the container's, bash and
    // zsh (both at the latest rate) in /user.slice.
    let rows = build_rows(&four_processes(), &opts(Grouping::Cgroup));
    let group = |command: &str| {
        let row = rows.iter().find(|r| r.command == command).expect("group");
        row.co2e_g.expect("grams")
    };
    assert!(close(
        group("docker:0123456789ab"),
        5.0 * 1e-3 + 30.0 * 3e-3
    ));
    assert!(close(group("/user.slice"), (500.0 + 100.0) * 2e-3));
    // Without rates no line has grams.
    let none = build(Sort::default(), "", Grouping::Process, &[]);
    assert!(none.iter().all(|r| r.co2e_g.is_none()));
}
