//! OTLP profiles (`opentelemetry.proto.profiles.v1development`, pinned to opentelemetry-proto
//! v1.10.0 in `proto/otlp`): one `ExportProfilesServiceRequest` per profile, as the agent
//! sends it to an OpenTelemetry Collector and `flamegraph --format otlp` writes it.
//!
//! - One dictionary (strings, mappings, locations, functions, stacks, attributes) is shared
//!   by every profile of the request; each table starts with its zero value, as the schema
//!   requires.
//! - A CPU profile: sample type `samples`/`count`, period type `cpu`/`nanoseconds`, period
//!   one sampling interval.
//! - One energy profile per domain (`package`, `dram`, `gpu`, ...): sample type and period
//!   type `energy`/`microjoules`, period 1 (so Pyroscope names it `energy`), and the domain
//!   in the profile attribute `energy.zone`. Values are whole µJ, rounded so that each
//!   profile's total is the attributed energy's total rounded once: nothing is lost to
//!   per-sample rounding.
//! - Sample attributes: `thread.id`, `thread.name`, `process.pid`,
//!   `process.executable.name`, `container.id` (when known), `cpu.logical_number`.
//! - Mappings carry `process.executable.build_id.gnu`; functions are symbolized here.
//! - Each location carries `profile.frame.type`, its frame kind as the profiles semantic
//!   conventions name it: `native`, `kernel`, `cpython`, `v8js`, `jvm`, `dotnet` (`jit`
//!   for other runtimes).

use std::collections::HashMap;
use std::io::Write;

use prost::Message as _;

use super::{OutputError, ProfileSink};
use crate::pb::otlp::{
    collector::profiles::v1development::ExportProfilesServiceRequest,
    common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value::Value},
    profiles::v1development as otlp,
    resource::v1::Resource,
};
use crate::profile::{CPU, Profile, SAMPLES};

/// Sample attributes of a container: (key, value) pairs.
pub type ContainerAttrs = Vec<(&'static str, String)>;

/// Who produced the profiles: resource attributes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Origin {
    /// `host.name`.
    pub host_name: String,
    /// `host.id` (the machine id), when known.
    pub host_id: Option<String>,
    /// `os.kernel` (and `os.version`): the kernel release.
    pub kernel: String,
}

/// Writes one binary `ExportProfilesServiceRequest`.
pub struct Otlp<'a> {
    /// Resource attributes.
    pub origin: Origin,
    /// Attributes of the container a cgroup id belongs to (`container.id`, and in
    /// Kubernetes `k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name`).
    pub container_of: &'a dyn Fn(u64) -> ContainerAttrs,
}

impl ProfileSink for Otlp<'_> {
    fn write_profile(&mut self, profile: &Profile, out: &mut dyn Write) -> Result<(), OutputError> {
        let req = request(profile, &self.origin, self.container_of);
        out.write_all(&req.encode_to_vec())?;
        Ok(())
    }
}

#[derive(Default)]
struct Dictionary {
    d: otlp::ProfilesDictionary,
    strings: HashMap<String, i32>,
    attributes: HashMap<(i32, String), i32>,
    stacks: HashMap<Vec<i32>, i32>,
}

impl Dictionary {
    fn new() -> Self {
        let mut d = Self::default();
        d.d.string_table.push(String::new());
        d.strings.insert(String::new(), 0);
        d.d.mapping_table.push(otlp::Mapping::default());
        d.d.location_table.push(otlp::Location::default());
        d.d.function_table.push(otlp::Function::default());
        d.d.link_table.push(otlp::Link::default());
        d.d.attribute_table.push(otlp::KeyValueAndUnit::default());
        d.d.stack_table.push(otlp::Stack::default());
        d
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.d.string_table.len() as i32;
        self.d.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn attribute(&mut self, key: &str, value: Value) -> i32 {
        let shown = format!("{value:?}");
        let key = self.string(key);
        if let Some(&i) = self.attributes.get(&(key, shown.clone())) {
            return i;
        }
        let i = self.d.attribute_table.len() as i32;
        self.d.attribute_table.push(otlp::KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue { value: Some(value) }),
            unit_strindex: 0,
        });
        self.attributes.insert((key, shown), i);
        i
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = self.d.stack_table.len() as i32;
        self.d.stack_table.push(otlp::Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }
}

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

/// The request for `profile`: a CPU profile and one energy profile per domain.
pub fn request(
    profile: &Profile,
    origin: &Origin,
    container_of: &dyn Fn(u64) -> ContainerAttrs,
) -> ExportProfilesServiceRequest {
    let mut dict = Dictionary::new();
    // Functions: one per interned frame, at index frame id + 1.
    for f in &profile.frames {
        let name = dict.string(&f.function);
        let file = dict.string(f.file.as_deref().unwrap_or(&f.module));
        dict.d.function_table.push(otlp::Function {
            name_strindex: name,
            system_name_strindex: name,
            filename_strindex: file,
            start_line: 0,
        });
    }
    for m in &profile.mappings {
        let filename = dict.string(&m.path);
        let attribute_indices = if m.build_id.is_empty() {
            Vec::new()
        } else {
            let hex: String = m.build_id.iter().map(|b| format!("{b:02x}")).collect();
            vec![dict.attribute("process.executable.build_id.gnu", Value::StringValue(hex))]
        };
        dict.d.mapping_table.push(otlp::Mapping {
            memory_start: m.start,
            memory_limit: m.end,
            file_offset: m.file_offset,
            filename_strindex: filename,
            attribute_indices,
        });
    }
    for l in &profile.locations {
        // The kind of the location's own function (the last frame; inlined ones share it).
        let kind = l
            .frames
            .last()
            .and_then(|&f| profile.frames.get(f as usize))
            .map_or(crate::symbolize::FrameKind::Native, |f| f.kind);
        let frame_type = dict.attribute(
            "profile.frame.type",
            Value::StringValue(kind.otel_name().to_string()),
        );
        dict.d.location_table.push(otlp::Location {
            mapping_index: l.mapping.map_or(0, |m| m as i32 + 1),
            address: l.address,
            lines: l
                .frames
                .iter()
                .map(|&f| otlp::Line {
                    function_index: f as i32 + 1,
                    line: profile
                        .frames
                        .get(f as usize)
                        .and_then(|fr| fr.line)
                        .map_or(0, i64::from),
                    column: 0,
                })
                .collect(),
            attribute_indices: vec![frame_type],
        });
    }
    // A process's name: its main thread's, where a sample of it shows it.
    let mut process_name: HashMap<u32, &str> = HashMap::new();
    for s in &profile.samples {
        if s.labels.tid == s.labels.pid || !process_name.contains_key(&s.labels.pid) {
            process_name.insert(s.labels.pid, &s.labels.comm);
        }
    }
    let shared: Vec<(i32, Vec<i32>)> = profile
        .samples
        .iter()
        .map(|s| {
            let stack = dict.stack(s.locations.iter().map(|&l| l as i32 + 1).collect());
            let l = &s.labels;
            let mut attrs = vec![
                dict.attribute("thread.id", Value::IntValue(i64::from(l.tid))),
                dict.attribute("thread.name", Value::StringValue(l.comm.to_string())),
                dict.attribute("process.pid", Value::IntValue(i64::from(l.pid))),
                dict.attribute(
                    "process.executable.name",
                    Value::StringValue(
                        process_name
                            .get(&l.pid)
                            .copied()
                            .unwrap_or(&l.comm)
                            .to_string(),
                    ),
                ),
            ];
            if l.cgroup != 0 {
                for (key, value) in container_of(l.cgroup) {
                    attrs.push(dict.attribute(key, Value::StringValue(value)));
                }
            }
            if let Some(cpu) = l.cpu {
                attrs.push(dict.attribute("cpu.logical_number", Value::IntValue(i64::from(cpu))));
            }
            (stack, attrs)
        })
        .collect();

    let mut profiles = Vec::new();
    let value_type = |dict: &mut Dictionary, t: &str, u: &str| otlp::ValueType {
        type_strindex: dict.string(t),
        unit_strindex: dict.string(u),
    };
    let base =
        |dict: &mut Dictionary, sample: (&str, &str), period: (&str, &str), p: i64| otlp::Profile {
            sample_type: Some(value_type(dict, sample.0, sample.1)),
            period_type: Some(value_type(dict, period.0, period.1)),
            period: p,
            time_unix_nano: profile.meta.start_unix_ns,
            duration_nano: profile.meta.duration_ns,
            ..otlp::Profile::default()
        };
    if let Some(k) = profile.value_index(SAMPLES) {
        let period = 1_000_000_000 / i64::from(profile.meta.sample_hz.max(1));
        let mut p = base(&mut dict, (SAMPLES, "count"), (CPU, "nanoseconds"), period);
        p.samples = samples(profile, &shared, k, |v| v.round() as i64);
        profiles.push(p);
    }
    for (k, vt) in profile.value_types.iter().enumerate() {
        // Energy, or its grams of CO2e (`flamegraph --unit co2e`).
        let (zone, kind, unit) = match (
            vt.name.strip_prefix("energy_"),
            vt.name.strip_prefix("co2e_"),
        ) {
            (Some(zone), _) => (zone, "energy", "microjoules"),
            (None, Some(zone)) => (zone, "co2e", "nanograms"),
            (None, None) => continue,
        };
        let mut p = base(&mut dict, (kind, unit), (kind, unit), 1);
        p.attribute_indices = vec![
            dict.attribute("energy.zone", Value::StringValue(zone.to_string())),
            dict.attribute("energy.estimated", Value::BoolValue(profile.meta.estimated)),
        ];
        // The estimated model's power-table row and its error (docs/estimated-energy.md).
        if !profile.meta.model_row.is_empty() {
            p.attribute_indices.push(dict.attribute(
                "energy.model_row",
                Value::StringValue(profile.meta.model_row.clone()),
            ));
            p.attribute_indices.push(dict.attribute(
                "energy.model_error",
                Value::DoubleValue(profile.meta.model_error_pct),
            ));
        }
        // Round the running total, not each value: the profile's sum is the total rounded
        // once, however many samples it has.
        let mut sum = 0.0f64;
        let mut emitted = 0i64;
        p.samples = samples(profile, &shared, k, |v| {
            sum += v;
            let next = sum.round() as i64;
            let out = next - emitted;
            emitted = next;
            out
        });
        profiles.push(p);
    }
    let mut resource = vec![
        kv("host.name", Value::StringValue(origin.host_name.clone())),
        kv("os.type", Value::StringValue("linux".into())),
        kv("os.kernel", Value::StringValue(origin.kernel.clone())),
        kv("os.version", Value::StringValue(origin.kernel.clone())),
    ];
    if let Some(id) = &origin.host_id {
        resource.push(kv("host.id", Value::StringValue(id.clone())));
    }
    ExportProfilesServiceRequest {
        resource_profiles: vec![otlp::ResourceProfiles {
            resource: Some(Resource {
                attributes: resource,
                ..Resource::default()
            }),
            scope_profiles: vec![otlp::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "energy-bpf".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dict.d),
    }
}

/// Adds to each energy profile (not its zone's co2e profile) the attribute
/// `energy.attributed_microjoules`: the energy the producer's own windows gave threads in
/// that zone (µJ, rounded), which the profile's values add up to. A receiver can check
/// conservation across the wire with it.
pub fn add_attributed(
    req: &mut ExportProfilesServiceRequest,
    attributed_uj: &std::collections::BTreeMap<&'static str, f64>,
) {
    let Some(dict) = req.dictionary.as_mut() else {
        return;
    };
    let strings = &dict.string_table;
    let zone_key = strings.iter().position(|s| s == "energy.zone");
    let mut additions = Vec::new();
    for (r, rp) in req.resource_profiles.iter().enumerate() {
        for (s, sp) in rp.scope_profiles.iter().enumerate() {
            for (p, prof) in sp.profiles.iter().enumerate() {
                // Only energy profiles: a zone's co2e profile weighs nanograms.
                let kind = prof
                    .sample_type
                    .as_ref()
                    .and_then(|t| strings.get(t.type_strindex as usize));
                if kind.map(String::as_str) != Some("energy") {
                    continue;
                }
                let zone = prof.attribute_indices.iter().find_map(|&i| {
                    let kv = dict.attribute_table.get(i as usize)?;
                    (Some(kv.key_strindex as usize) == zone_key).then_some(())?;
                    match kv.value.as_ref()?.value.as_ref()? {
                        Value::StringValue(z) => Some(z.clone()),
                        _ => None,
                    }
                });
                if let Some(uj) = zone.and_then(|z| attributed_uj.get(z.as_str())) {
                    additions.push((r, s, p, uj.round() as i64));
                }
            }
        }
    }
    let key = dict.string_table.len() as i32;
    dict.string_table
        .push("energy.attributed_microjoules".into());
    for (r, s, p, uj) in additions {
        let index = dict.attribute_table.len() as i32;
        dict.attribute_table.push(otlp::KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue {
                value: Some(Value::IntValue(uj)),
            }),
            unit_strindex: 0,
        });
        req.resource_profiles[r].scope_profiles[s].profiles[p]
            .attribute_indices
            .push(index);
    }
}

/// The samples of value `k` with a non-zero (converted) value.
fn samples(
    profile: &Profile,
    shared: &[(i32, Vec<i32>)],
    k: usize,
    mut convert: impl FnMut(f64) -> i64,
) -> Vec<otlp::Sample> {
    profile
        .samples
        .iter()
        .zip(shared)
        .filter_map(|(s, (stack, attrs))| {
            let v = convert(s.values.get(k).copied().unwrap_or(0.0));
            (v != 0).then(|| otlp::Sample {
                stack_index: *stack,
                attribute_indices: attrs.clone(),
                link_index: 0,
                values: vec![v],
                timestamps_unix_nano: Vec::new(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{analysis, attribute::Options};

    fn fixture_request() -> (ExportProfilesServiceRequest, f64) {
        let rec = analysis::fixture::recording();
        let cfg = analysis::config(
            &rec,
            Options::default(),
            &analysis::ModelOverride::default(),
        );
        let a = analysis::analyze(&rec, &cfg);
        let attributed = a.attribution.total_uj()
            - a.attribution.headline_uj(&a.attribution.idle)
            - a.attribution.headline_uj(&a.attribution.unknown);
        let p = analysis::profile(&rec, &a, &crate::profile::Filter::default());
        let origin = Origin {
            host_name: "box".into(),
            host_id: Some("abc".into()),
            kernel: "6.18.0".into(),
        };
        (
            request(&p, &origin, &|_| vec![("container.id", "c0ffee".into())]),
            attributed,
        )
    }

    fn string(req: &ExportProfilesServiceRequest, i: i32) -> &str {
        &req.dictionary.as_ref().expect("dictionary").string_table[i as usize]
    }

    #[test]
    fn cpu_and_energy_profiles_share_one_dictionary_and_conserve_energy() {
        let (req, attributed_uj) = fixture_request();
        let dict = req.dictionary.as_ref().expect("dictionary");
        assert_eq!(dict.string_table[0], "");
        assert_eq!(dict.mapping_table[0], otlp::Mapping::default());
        let profiles = &req.resource_profiles[0].scope_profiles[0].profiles;
        assert_eq!(profiles.len(), 2, "cpu + package");
        let types: Vec<(&str, &str, &str, &str, i64)> = profiles
            .iter()
            .map(|p| {
                let s = p.sample_type.expect("sample type");
                let t = p.period_type.expect("period type");
                (
                    string(&req, s.type_strindex),
                    string(&req, s.unit_strindex),
                    string(&req, t.type_strindex),
                    string(&req, t.unit_strindex),
                    p.period,
                )
            })
            .collect();
        assert_eq!(
            types[0],
            ("samples", "count", "cpu", "nanoseconds", 100_000_000)
        );
        assert_eq!(
            types[1],
            ("energy", "microjoules", "energy", "microjoules", 1)
        );
        let energy: i64 = profiles[1].samples.iter().flat_map(|s| &s.values).sum();
        assert_eq!(
            energy,
            attributed_uj.round() as i64,
            "conserved through rounding"
        );
        let zone = &dict.attribute_table[profiles[1].attribute_indices[0] as usize];
        assert_eq!(string(&req, zone.key_strindex), "energy.zone");
        // Every sample names its thread, process, container and CPU.
        let keys: Vec<&str> = profiles[0].samples[0]
            .attribute_indices
            .iter()
            .map(|&i| string(&req, dict.attribute_table[i as usize].key_strindex))
            .collect();
        assert_eq!(
            keys,
            [
                "thread.id",
                "thread.name",
                "process.pid",
                "process.executable.name",
                "cpu.logical_number"
            ],
            "no cgroup in the fixture, so no container.id"
        );
        let res: Vec<&str> = req.resource_profiles[0]
            .resource
            .as_ref()
            .expect("resource")
            .attributes
            .iter()
            .map(|kv| kv.key.as_str())
            .collect();
        assert!(
            res.contains(&"host.name") && res.contains(&"host.id") && res.contains(&"os.kernel")
        );
        // Every location says its frame type; the fixture's code is native.
        let types: std::collections::BTreeSet<&str> = dict.location_table[1..]
            .iter()
            .map(|l| {
                let kv = &dict.attribute_table[l.attribute_indices[0] as usize];
                assert_eq!(string(&req, kv.key_strindex), "profile.frame.type");
                match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Value::StringValue(s)) => s.as_str(),
                    other => panic!("frame type {other:?}"),
                }
            })
            .collect();
        assert_eq!(types, ["native"].into_iter().collect());
        // Stacks point at real locations, functions at real names.
        for p in profiles {
            for s in &p.samples {
                let stack = &dict.stack_table[s.stack_index as usize];
                assert!(!stack.location_indices.is_empty());
                for &l in &stack.location_indices {
                    let loc = &dict.location_table[l as usize];
                    let f = &dict.function_table[loc.lines[0].function_index as usize];
                    assert!(!string(&req, f.name_strindex).is_empty());
                }
            }
        }
    }
}
