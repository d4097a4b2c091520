//! One recording in, everything the outputs need out: the recording as one window of the
//! [`pipeline`] (timeline, readings, attribution), so `report`, `flamegraph`, `top --replay`
//! and the exporters can never disagree; [`sample_values`] and [`profile()`] turn an
//! analysis into the per-sample weights and the symbolized [`Profile`] that `flamegraph`
//! and `report --by function` share.

use std::path::PathBuf;

use crate::{
    attribute::{Options, domain_name},
    energy,
    pb::v1::{EnergyDomain, EnergySource, ThreadInfo},
    pipeline::{self, Config},
    profile::{self, Filter, Profile, Residual, SampleValues, ValueType},
    record::Recording,
    symbolize::Symbolizer,
};

pub(crate) use crate::pipeline::{Analysis, source_label};

/// Model parameters to recompute an estimated recording with (`report --model-idle-w ...`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelOverride {
    /// Idle power per package, W.
    pub idle_w: Option<f64>,
    /// Full-load power per package, W.
    pub max_w: Option<f64>,
}

/// The pipeline configuration of a recording: its topology, its sources (model parameters
/// overridden when asked) and the attribution options.
pub fn config(rec: &Recording, options: Options, model: &ModelOverride) -> Config {
    let sources: Vec<EnergySource> = rec
        .sources
        .iter()
        .cloned()
        .map(|mut s| {
            if energy::model::is_model(&s) {
                if let Some(w) = model.idle_w {
                    s.model_idle_w = w;
                    s.model_origin = "report --model-idle-w".into();
                }
                if let Some(w) = model.max_w {
                    s.model_max_w = w;
                    s.model_origin = "report --model-max-w".into();
                }
                // Given watts are no longer the table's: its row and error no longer apply.
                if model.idle_w.is_some() || model.max_w.is_some() {
                    s.model_row.clear();
                    s.model_error_pct = 0.0;
                }
            }
            s
        })
        .collect();
    Config {
        cpus: rec.header.cpus.clone(),
        sources,
        options,
        activity_event: activity_event(rec),
    }
}

/// The activity event a recording's switch events count, if any.
pub fn activity_event(rec: &Recording) -> Option<String> {
    Some(rec.header.activity_event.clone()).filter(|e| !e.is_empty())
}

/// Analyses a whole recording as one window.
pub fn analyze(rec: &Recording, cfg: &Config) -> Analysis {
    let threads: Vec<ThreadInfo> = rec.threads.values().cloned().collect();
    pipeline::analyze(&rec.window(), cfg, &threads)
}

/// [`source_label`] followed by ` (estimated)` when any source is modelled, with the power
/// table's row when the model's parameters came from it (` (estimated: Intel Xeon … →
/// Ice Lake-SP, …, ±12%)`): for text a person reads next to the numbers.
pub(crate) fn source_description(sources: &[EnergySource]) -> String {
    let label = source_label(sources);
    if let Some(row) = crate::energy::model::row_label(sources) {
        format!("{label} (estimated: {row})")
    } else if sources.iter().any(|s| s.estimated) {
        format!("{label} (estimated)")
    } else {
        label
    }
}

/// Energy domains with a source in this analysis, in proto order (PACKAGE before DRAM).
pub fn domains(analysis: &Analysis) -> Vec<EnergyDomain> {
    crate::attribute::attribution::DOMAINS
        .into_iter()
        .filter(|&d| analysis.attribution.sources.iter().any(|s| s.domain == d))
        .collect()
}

/// Per-sample weights of a recording (or of any [`Stacks`](crate::profile::Stacks) the
/// analysis covers): CPU time (ns), then the attributed energy (µJ) of each domain present,
/// one row per `samples[i]` (attribution's `sample_energy` is
/// aligned with them). Thread energy no stack sample carries becomes a residual, shown as
/// `[no stack sample]`, so a profile's total is every thread's attributed energy.
pub fn sample_values<'a>(
    input: impl Into<crate::profile::Stacks<'a>>,
    analysis: &Analysis,
) -> SampleValues {
    let rec: crate::profile::Stacks<'a> = input.into();
    let attr = &analysis.attribution;
    let domains = domains(analysis);
    let mut out = SampleValues::cpu_time(rec);
    let period_ns = out.values.first().copied().unwrap_or(0.0);
    out.value_types
        .extend(domains.iter().map(|&d| ValueType::energy(domain_name(d))));
    let width = out.value_types.len();
    out.values = Vec::with_capacity(rec.samples.len() * width);
    for i in 0..rec.samples.len() {
        out.values.push(period_ns);
        let energy = attr.sample_energy.get(i);
        out.values
            .extend(domains.iter().map(|&d| energy.map_or(0.0, |e| e.get(d))));
    }
    out.residuals = attr
        .threads
        .iter()
        .filter(|t| domains.iter().any(|&d| t.no_stack.get(d) != 0.0))
        .map(|t| Residual {
            tgid: t.tgid,
            tid: t.tid,
            values: std::iter::once(0.0)
                .chain(domains.iter().map(|&d| t.no_stack.get(d)))
                .collect(),
        })
        .collect();
    out.estimated = attr.estimated;
    out.model_row = crate::energy::model::row_label(&analysis.sources).unwrap_or_default();
    out.model_error_pct = crate::energy::model::row_error_pct(&analysis.sources).unwrap_or(0.0);
    let idle_j = attr.headline_uj(&attr.idle) * 1e-6;
    out.source = if idle_j > 0.0 {
        // Idle/static energy belongs to no stack; say how much the picture leaves out.
        format!(
            "{}; idle/static {idle_j:.3} J not shown",
            source_description(&analysis.sources)
        )
    } else {
        source_description(&analysis.sources)
    };
    out
}

/// A symbolizer for a recording: the names it stored first, then for any other address
/// kernel symbols of the recorded kernel (/proc/kallsyms only when the recording was made
/// on the running kernel, else kernel frames stay `[kernel]+0xADDR` rather than get
/// another kernel's names) and the mapped files.
pub fn symbolizer_for(rec: &Recording) -> Symbolizer {
    let running = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let same_kernel =
        rec.header.kernel_release.is_empty() || running.trim() == rec.header.kernel_release;
    let mut symbolizer =
        Symbolizer::with_kallsyms(same_kernel.then(|| PathBuf::from("/proc/kallsyms")));
    symbolizer.use_stored(&rec.symbols);
    symbolizer
}

/// The symbolized profile of a recording weighted by its analysis ([`sample_values`]).
pub fn profile(rec: &Recording, analysis: &Analysis, filter: &Filter) -> Profile {
    let weights = sample_values(rec, analysis);
    profile::build(rec, &weights, &mut symbolizer_for(rec), filter)
}

/// A small modelled recording for tests of the outputs built on an analysis.
#[cfg(test)]
pub(crate) mod fixture {
    use crate::pb::v1::{Cpu, EnergyDomain, EnergySource, Header, Sample, SwitchEvent, ThreadInfo};
    use crate::record::Recording;

    fn switch(ts_ns: u64, tid: u32, next: u32) -> SwitchEvent {
        SwitchEvent {
            ts_ns,
            cpu: 0,
            tid,
            tgid: tid,
            next_known: true,
            next_tid: next,
            next_tgid: next,
            ..Default::default()
        }
    }

    /// One CPU for 1 s under a model source (idle 1 W, full load 3 W, estimated): `heavy`
    /// (pid 10) runs 0-600 ms with 6 samples, `light` (pid 20) 600-900 ms with 3 samples,
    /// `quiet` (pid 30) 900-1000 ms with none; so the busy CPU draws 2 W above idle, heavy
    /// gets 1.2 J, light 0.6 J, quiet 0.2 J with no stack sample, idle/static 1 J.
    pub(crate) fn recording() -> Recording {
        let mut rec = Recording {
            header: Header {
                format_version: crate::record::FORMAT_VERSION,
                sample_hz: 10,
                hostname: "box".into(),
                cpus: vec![Cpu {
                    id: 0,
                    package: 0,
                    core: 0,
                }],
                ..Header::default()
            },
            switches: vec![
                switch(0, 0, 10),
                switch(600_000_000, 10, 20),
                switch(900_000_000, 20, 30),
            ]
            .into(),
            sources: vec![EnergySource {
                id: 1,
                kind: "model".into(),
                domain: EnergyDomain::Package as i32,
                estimated: true,
                model_idle_w: 1.0,
                model_max_w: 3.0,
                ..Default::default()
            }],
            end_ns: 1_000_000_000,
            ..Recording::default()
        };
        for (tid, comm) in [(10, "heavy"), (20, "light"), (30, "quiet")] {
            rec.threads.insert(
                tid,
                ThreadInfo {
                    tid,
                    tgid: tid,
                    comm: comm.into(),
                    ..Default::default()
                },
            );
        }
        for i in 0..9u64 {
            let tid = if i < 6 { 10 } else { 20 };
            rec.samples.push(Sample {
                ts_ns: i * 100_000_000 + 50_000_000,
                cpu: 0,
                tid,
                tgid: tid,
                user_stack: vec![0x1000 + u64::from(tid)],
                ..Sample::default()
            });
        }
        rec
    }

    /// [`recording`] written to `path` as `energy-bpf record` would, with `lost` switch
    /// events reported dropped.
    pub(crate) fn write(path: &std::path::Path, lost: u64) {
        use crate::pb::v1::{Chunk, LossCounters, Trailer};
        let rec = recording();
        let mut w = crate::record::Writer::create(path, &rec.header).expect("create recording");
        let losses = LossCounters {
            switch_dropped: lost,
            ..Default::default()
        };
        w.chunk(Chunk {
            switches: rec.switches.to_vec(),
            samples: rec.samples.clone(),
            threads: rec.threads.values().cloned().collect(),
            sources: rec.sources.clone(),
            losses: Some(losses),
            ..Default::default()
        })
        .expect("write chunk");
        w.finish(Trailer {
            end_ns: rec.end_ns,
            stop_reason: "test".into(),
            losses: Some(losses),
        })
        .expect("finish recording");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_values_carry_attributed_energy_and_residuals() {
        let rec = fixture::recording();
        let a = analyze(
            &rec,
            &config(&rec, Options::default(), &ModelOverride::default()),
        );
        assert_eq!(domains(&a), vec![EnergyDomain::Package]);
        let v = sample_values(&rec, &a);
        let names: Vec<&str> = v.value_types.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["cpu", "energy_package"]);
        assert!(v.estimated);
        assert!(v.source.contains("model (estimated)"), "{}", v.source);
        assert!(v.source.contains("idle/static 1.000 J"), "{}", v.source);
        // 100 ms of CPU per sample at 10 Hz; heavy's 1.2 J over its 6 samples.
        assert_eq!(v.row(0)[0], 1e8);
        let heavy: f64 = (0..6).map(|i| v.row(i)[1]).sum();
        let light: f64 = (6..9).map(|i| v.row(i)[1]).sum();
        assert!((heavy - 1.2e6).abs() < 1.0, "{heavy}");
        assert!((light - 0.6e6).abs() < 1.0, "{light}");
        assert_eq!(v.residuals.len(), 1);
        assert_eq!(v.residuals[0].tid, 30);
        assert!((v.residuals[0].values[1] - 0.2e6).abs() < 1.0);
        assert_eq!(v.residuals[0].values[0], 0.0);
    }

    #[test]
    fn a_counter_that_never_moves_does_not_hide_the_domains_that_measured() {
        // A hypervisor's PSYS event that stays at 0 beside the package model: the headline
        // must stay the package, not the (empty) PSYS that nominally contains it.
        let mut rec = fixture::recording();
        rec.sources.push(EnergySource {
            id: 2,
            kind: "perf".into(),
            domain: EnergyDomain::Psys as i32,
            ..Default::default()
        });
        for ts_ns in [0, 500_000_000, 1_000_000_000] {
            rec.readings.push(crate::pb::v1::EnergyReading {
                source_id: 2,
                ts_ns,
                energy_uj: 0.0,
                ..Default::default()
            });
        }
        let a = analyze(
            &rec,
            &config(&rec, Options::default(), &ModelOverride::default()),
        );
        assert_eq!(a.attribution.headline, vec![EnergyDomain::Package]);
        assert!((a.attribution.total_uj() - 3.0e6).abs() < 1.0);
    }

    #[test]
    fn profile_total_is_the_attributed_energy() {
        let rec = fixture::recording();
        let a = analyze(
            &rec,
            &config(&rec, Options::default(), &ModelOverride::default()),
        );
        let p = profile(&rec, &a, &Filter::default());
        let k = p.value_index("energy_package").expect("package values");
        assert!(
            (p.meta.totals[k] - 2.0e6).abs() < 1.0,
            "{}",
            p.meta.totals[k]
        );
        assert!(p.meta.estimated);
    }
}
