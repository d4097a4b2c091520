//! One recording in, everything the outputs need out: the timeline, the energy readings
//! (recorded counters, or the estimated model recomputed from the timeline), and the
//! attribution. Every command that reports energy goes through [`analyze`], so `report`,
//! `flamegraph` and the exporters can never disagree.

use crate::{
    attribute::{self, Attribution, Options},
    energy,
    pb::v1::{EnergyReading, EnergySource, ThreadInfo},
    record::Recording,
    timeline::Timeline,
};

/// Model parameters to recompute an estimated recording with (`report --model-idle-w ...`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ModelOverride {
    /// Recompute modelled (estimated) energy with this idle power per package, W.
    #[arg(long = "model-idle-w", value_name = "W")]
    pub idle_w: Option<f64>,
    /// Recompute modelled (estimated) energy with this full-load power per package, W.
    #[arg(long = "model-max-w", value_name = "W")]
    pub max_w: Option<f64>,
}

/// A recording analysed.
pub struct Analysis {
    /// Who ran where, when.
    pub timeline: Timeline,
    /// Sources used (model parameters overridden when asked).
    pub sources: Vec<EnergySource>,
    /// Readings used (recorded, or modelled from the timeline).
    pub readings: Vec<EnergyReading>,
    /// Energy per thread, process, sample.
    pub attribution: Attribution,
}

/// Analyses a recording.
pub fn analyze(rec: &Recording, opts: &Options, model: &ModelOverride) -> Analysis {
    let timeline = rec.timeline();
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
            }
            s
        })
        .collect();
    let readings = energy::readings_for(&sources, &rec.readings, &timeline, &rec.header.cpus);
    let threads: Vec<ThreadInfo> = rec.threads.values().cloned().collect();
    let attribution = attribute::attribute(
        &attribute::Input {
            timeline: &timeline,
            samples: &rec.samples,
            sources: &sources,
            readings: &readings,
            cpus: &rec.header.cpus,
            threads: &threads,
            activity: None,
        },
        opts,
    );
    Analysis {
        timeline,
        sources,
        readings,
        attribution,
    }
}

/// The kinds of sources in use, e.g. `powercap`, `model`, `powercap+nvml` (`none` when the
/// recording has none). Whether they are estimated is said separately, next to the numbers.
pub fn source_label(sources: &[EnergySource]) -> String {
    let mut kinds: Vec<&str> = sources.iter().map(|s| s.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    if kinds.is_empty() {
        "none".into()
    } else {
        kinds.join("+")
    }
}
