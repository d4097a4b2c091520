//! The bounded keeper, its file, and the estimate over kept intervals.

use std::os::unix::fs::PermissionsExt as _;

use super::keeper::MAX_LEVELS;
use super::store;
use super::*;
use crate::attribute::Unidentified;

/// An interval at `t` s of a machine drawing 6 W + 10 W per busy CPU (± `noise` W).
fn at(t: u32, busy: f64, noise: f64) -> Kept {
    Kept {
        unix_s: 1.7e9 + f64::from(t),
        secs: 1.0,
        power_w: 6.0 + 10.0 * busy + noise,
        busy_cpus: busy,
        activity_per_s: None,
    }
}

/// A deterministic ±0.2 W wobble.
fn wobble(i: u32) -> f64 {
    f64::from((i * 7919) % 41) / 100.0 - 0.2
}

#[test]
fn keeps_the_lowest_levels_and_stays_bounded() {
    // A 2-CPU machine (0.05-CPU levels), busy between 0.5 and 2 CPUs for hours, with a
    // quiet spell at 0.2-0.3 CPUs somewhere in the middle.
    let mut k = Keeper::new(2);
    for i in 0..20_000u32 {
        let busy = if (9_000..9_100).contains(&i) {
            0.2 + f64::from(i % 3) * 0.05
        } else {
            0.5 + f64::from(i % 31) * 0.05
        };
        k.offer(at(i, busy, wobble(i)));
        assert!(k.kept.len() <= CAPACITY, "{} kept", k.kept.len());
    }
    assert_eq!(k.kept.len(), CAPACITY);
    let levels = k.levels();
    assert_eq!(levels.len(), MAX_LEVELS, "{levels:?}");
    // The quiet spell survives 10,900 busier intervals after it...
    let quiet = k.kept.iter().filter(|x| x.busy_cpus < 0.4).count();
    assert!(
        quiet >= 3 * (CAPACITY / MAX_LEVELS),
        "{quiet} quiet intervals kept"
    );
    // ...and the levels kept are the lowest seen: 0.2..0.3 and then 0.5 upwards.
    let highest = k.kept.iter().map(|x| x.busy_cpus).fold(0.0, f64::max);
    assert!(highest < 0.5 + 13.0 * 0.05 + 1e-9, "highest kept {highest}");
    // Levels share the room: none holds more than its share plus one.
    let most = levels.values().max().copied().unwrap_or(0);
    assert!(most <= CAPACITY / MAX_LEVELS + 1, "{levels:?}");
}

#[test]
fn keeps_a_spread_on_a_mostly_idle_machine() {
    // 99% of intervals at 0.0-0.1 CPUs, 1% at 1.0-1.5: the busier ones are what the fit
    // needs to see the slope, and they must not be crowded out.
    let mut k = Keeper::new(2);
    for i in 0..10_000u32 {
        let busy = if i % 100 == 0 {
            1.0 + f64::from(i / 100 % 11) * 0.05
        } else {
            f64::from(i % 3) * 0.04
        };
        k.offer(at(i, busy, wobble(i)));
    }
    let busy = k.kept.iter().filter(|x| x.busy_cpus >= 1.0).count();
    assert!(busy >= 20, "{busy} busy intervals of {}", k.kept.len());
    let learned = k.estimate().expect("identified");
    assert!((learned.watts - 6.0).abs() < 0.2, "{learned:?}");
    assert!((learned.fit.slope_w - 10.0).abs() < 0.5, "{learned:?}");
}

#[test]
fn refreshes_a_crowded_level_with_newer_intervals() {
    let mut k = Keeper::new(2);
    for i in 0..(CAPACITY as u32 * 3) {
        k.offer(at(i, 0.5, 0.0));
    }
    assert_eq!(k.kept.len(), CAPACITY);
    // The oldest went first.
    assert_eq!(k.kept[0].unix_s, 1.7e9 + f64::from(CAPACITY as u32 * 2));
}

#[test]
fn refuses_garbage_intervals() {
    let mut k = Keeper::new(2);
    for bad in [f64::NAN, f64::INFINITY, -1.0] {
        assert!(!k.offer(Kept {
            power_w: bad,
            ..at(0, 0.5, 0.0)
        }));
        assert!(!k.offer(Kept {
            busy_cpus: bad,
            ..at(0, 0.5, 0.0)
        }));
    }
    assert!(k.kept.is_empty());
}

#[test]
fn estimate_is_identified_only_with_spread_and_never_above_the_quietest_interval() {
    let mut k = Keeper::new(2);
    // Every interval at the same utilisation: no intercept.
    for i in 0..40 {
        k.offer(at(i, 1.0, wobble(i)));
    }
    assert_eq!(k.estimate(), Err(Unidentified::NoSpread));
    // Too few to fit.
    let mut few = Keeper::new(2);
    for i in 0..5 {
        few.offer(at(i, f64::from(i) * 0.3, 0.0));
    }
    assert_eq!(few.estimate(), Err(Unidentified::TooFewIntervals));
    // Spread between 0.1 and 1.6 busy CPUs: 6 W learned, within the bootstrap interval.
    let mut spread = Keeper::new(2);
    for i in 0..200u32 {
        spread.offer(at(i, 0.1 + f64::from(i % 31) * 0.05, wobble(i)));
    }
    let l = spread.estimate().expect("identified");
    assert!((l.watts - 6.0).abs() < 0.15, "{l:?}");
    assert!(l.fit.ci_low_w <= l.watts + 0.2 && l.fit.ci_high_w >= l.watts - 0.2);
    assert_eq!(l.intervals, spread.kept.len());
    let first = spread
        .kept
        .iter()
        .map(|x| x.unix_s)
        .fold(f64::MAX, f64::min);
    let last = spread.kept.iter().map(|x| x.unix_s).fold(0.0, f64::max);
    assert!((l.span_s - (last - first + 1.0)).abs() < 1e-6, "{l:?}");
    // A fit whose intercept is above the quietest interval is held to it.
    let mut bent = Keeper::new(2);
    for i in 0..60u32 {
        let busy = 0.1 + f64::from(i % 20) * 0.05;
        // One interval far below the line (a late counter read): static power cannot
        // exceed what the machine drew in its quietest interval.
        let p = if i == 0 {
            2.0
        } else {
            6.0 + 10.0 * busy + wobble(i)
        };
        bent.offer(Kept {
            power_w: p,
            ..at(i, busy, 0.0)
        });
    }
    let l = bent.estimate().expect("identified");
    assert!(l.watts <= 2.0 + 1e-12, "{l:?}");
}

fn spread_keeper() -> Keeper {
    let mut k = Keeper::new(2);
    for i in 0..100u32 {
        k.offer(Kept {
            activity_per_s: (i % 2 == 0).then_some(2.4e9),
            ..at(i, 0.1 + f64::from(i % 21) * 0.05, wobble(i))
        });
    }
    k
}

/// Equal up to the last bits JSON may round a float by.
fn assert_same(a: &BTreeMap<String, Keeper>, b: &BTreeMap<String, Keeper>) {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (x, y) in a.values().zip(b.values()) {
        assert_eq!(x.kept.len(), y.kept.len());
        for (p, q) in x.kept.iter().zip(&y.kept) {
            for (u, v) in [
                (p.unix_s, q.unix_s),
                (p.secs, q.secs),
                (p.power_w, q.power_w),
                (p.busy_cpus, q.busy_cpus),
                (
                    p.activity_per_s.unwrap_or(0.0),
                    q.activity_per_s.unwrap_or(0.0),
                ),
            ] {
                assert!((u - v).abs() <= 1e-9 * u.abs().max(1.0), "{p:?} vs {q:?}");
            }
        }
    }
}

#[test]
fn state_file_round_trips_with_mode_0600() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let path = store::path_in(&state);
    let keepers = BTreeMap::from([("powercap:package-0".to_string(), spread_keeper())]);
    store::save(&path, "box", &keepers).expect("save");
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let dmode = std::fs::metadata(&state)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(dmode & 0o777, 0o700);
    let back = store::load(&path, "box");
    assert_same(&back, &keepers);
    assert!(store::load(&path, "other-host").is_empty());
    // The estimate survives the trip.
    let k = back["powercap:package-0"].clone().sanitised(2);
    let (a, b) = (
        k.estimate().expect("identified"),
        keepers["powercap:package-0"]
            .estimate()
            .expect("identified"),
    );
    assert!((a.watts - b.watts).abs() < 1e-9, "{a:?} vs {b:?}");
    // Nothing else is left in the directory.
    assert_eq!(std::fs::read_dir(&state).expect("ls").count(), 1);
}

#[test]
fn garbage_truncated_or_huge_state_files_read_as_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store::path_in(dir.path());
    let keepers = BTreeMap::from([("powercap:package-0".to_string(), spread_keeper())]);
    store::save(&path, "box", &keepers).expect("save");
    let good = std::fs::read(&path).expect("read");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() / 2].to_vec()),
        ("garbage", b"\x00\xffnot json at all".to_vec()),
        ("empty", Vec::new()),
        (
            "other version",
            String::from_utf8_lossy(&good)
                .replace("\"version\":1", "\"version\":99")
                .into_bytes(),
        ),
        ("huge", vec![b' '; 3 << 20]),
    ];
    for (what, bytes) in cases {
        std::fs::write(&path, &bytes).expect("write");
        assert!(store::load(&path, "box").is_empty(), "{what} file was used");
    }
    // A missing file is simply empty, and a later save replaces garbage.
    std::fs::remove_file(&path).expect("rm");
    assert!(store::load(&path, "box").is_empty());
    std::fs::write(&path, b"garbage").expect("write");
    store::save(&path, "box", &keepers).expect("save over garbage");
    assert_same(&store::load(&path, "box"), &keepers);
}

#[test]
fn intervals_read_back_are_bounded_and_cleaned() {
    // A file edited by hand (or by a bug): too many intervals, some invalid, out of order.
    let mut k = Keeper::new(2);
    k.kept = (0..500u32)
        .rev()
        .map(|i| at(i, 0.1 + f64::from(i % 25) * 0.05, 0.0))
        .collect();
    k.kept[3].power_w = f64::NAN;
    k.level_cpus = -3.0;
    let k = k.sanitised(2);
    assert!(k.kept.len() <= CAPACITY);
    assert!(k.levels().len() <= MAX_LEVELS);
    assert!(k.kept.iter().all(|x| x.power_w.is_finite()));
    assert!(k.kept.windows(2).all(|w| w[0].unix_s <= w[1].unix_s));
    assert_eq!(k.level_cpus, 0.05);
}

#[test]
fn learner_persists_across_restarts() {
    use crate::attribute::load::{LoadRow, SourceLoad};
    let dir = tempfile::tempdir().expect("tempdir");
    let load = SourceLoad {
        key: "powercap:package-0".into(),
        name: "package-0".into(),
        cpus: 2,
        rows: (0..80u32)
            .map(|i| {
                let busy = 0.1 + f64::from(i % 17) * 0.1;
                LoadRow {
                    end_ns: u64::from(i + 1) * 1_000_000_000,
                    len_ns: 1_000_000_000,
                    power_w: 6.0 + 10.0 * busy + wobble(i),
                    busy_cpus: busy,
                    activity_per_s: None,
                }
            })
            .collect(),
    };
    let mut first = Learner::open(dir.path(), "box");
    let out = first.observe(std::slice::from_ref(&load), 0);
    let learned = out[0].learned.expect("identified");
    first.save();
    drop(first);
    let mut again = Learner::open(dir.path(), "box");
    let empty = SourceLoad {
        rows: Vec::new(),
        ..load
    };
    let out = again.observe(&[empty], 0);
    let back = out[0].learned.expect("still identified after a restart");
    assert!(
        (back.watts - learned.watts).abs() < 1e-9,
        "{back:?} vs {learned:?}"
    );
    assert_eq!(back.intervals, learned.intervals);
}

#[test]
fn learns_the_simulated_static_power_from_windows_of_a_busy_machine() {
    use crate::{
        attribute::load::load_rows,
        testing::{scenarios::one_cpu_always_busy, sim::simulate},
    };
    // Windows of the machine (6 W static, one CPU never idle), as the agent would
    // see them one after another.
    let mut k = Keeper::new(2);
    for seed in 1..=6 {
        let out = simulate(&one_cpu_always_busy(seed));
        let input = crate::attribute::Input {
            timeline: &out.timeline,
            samples: &[],
            sources: &out.sources,
            readings: &out.readings,
            cpus: &out.cpus,
            threads: &[],
            activity: None,
        };
        for load in load_rows(&input, ROW_NS) {
            for row in &load.rows {
                k.offer(Kept::from_row(row, i128::from(seed) * 100_000_000_000));
            }
        }
    }
    let l = k.estimate().expect("identified");
    assert!((l.watts - 6.0).abs() < 0.1, "{l:?}");
    assert!(
        l.fit.ci_low_w - 0.1 <= 6.0 && 6.0 <= l.fit.ci_high_w + 0.1,
        "{l:?}"
    );
}
