//! The CPU power table: what a server of a given CPU draws at the wall, idle and at full
//! load, fitted from SPECpower_ssj2008 results (`userspace/data/specpower/`, built by
//! `cargo xtask model-table build`; docs/estimated-energy.md says how and how well).
//!
//! Pure and self-contained (no `crate::` imports): `xtask` compiles this same file to fit
//! the table and to check it, so the fit and the prediction cannot drift apart.
//!
//! What a server's watts are made of (per node, both at active idle and at 100% load):
//! `ln P = b_chips·ln chips + b_mem·ln GB + b_threads·ln threads + b_0 + b_amd·[AMD] +
//! b_server·[server class]`. A row (a CPU model, else its microarchitecture, else its
//! vendor) names what was matched, how many measured servers stand behind it, its
//! typical server (threads per chip, GB per thread) and the spread of the fit's
//! leave-one-out errors over those servers: the error the model says.

use std::fmt;

/// The most bytes of a table text [`Table::parse`] accepts.
pub const MAX_TABLE_BYTES: usize = 512 * 1024;
/// The most rows of a table.
const MAX_ROWS: usize = 4096;

/// A CPU vendor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// Intel.
    Intel,
    /// AMD.
    Amd,
}

impl Vendor {
    /// The table's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Intel => "Intel",
            Vendor::Amd => "AMD",
        }
    }

    fn parse(s: &str) -> Option<Vendor> {
        match s {
            "Intel" => Some(Vendor::Intel),
            "AMD" => Some(Vendor::Amd),
            _ => None,
        }
    }
}

/// A microarchitecture: its name, vendor, class and the x86 family/model ids it has.
#[derive(Debug, PartialEq)]
pub struct Arch {
    /// Name, e.g. `Ice Lake-SP`.
    pub name: &'static str,
    /// Vendor.
    pub vendor: Vendor,
    /// A server part (Xeon E5/E7/Scalable, EPYC) rather than a desktop/E3 one.
    pub server: bool,
    /// CPUID family.
    pub family: u32,
    /// CPUID models; for family 6 model 0x55, `steppings` tells the three apart.
    pub models: &'static [u32],
    /// Inclusive stepping range, where the model alone is ambiguous.
    pub steppings: (u32, u32),
}

const fn arch(
    name: &'static str,
    vendor: Vendor,
    server: bool,
    family: u32,
    models: &'static [u32],
) -> Arch {
    Arch {
        name,
        vendor,
        server,
        family,
        models,
        steppings: (0, u32::MAX),
    }
}

/// Every microarchitecture the table or the detection knows (Intel SDM vol. 4 and AMD's
/// processor programming references give the family/model ids).
pub static ARCHS: &[Arch] = &[
    arch("Nehalem-EP", Vendor::Intel, true, 6, &[0x1A, 0x2E]),
    arch("Westmere-EP", Vendor::Intel, true, 6, &[0x2C, 0x2F]),
    arch("Sandy Bridge-EP", Vendor::Intel, true, 6, &[0x2D]),
    arch("Ivy Bridge-EP", Vendor::Intel, true, 6, &[0x3E]),
    arch("Haswell-EP", Vendor::Intel, true, 6, &[0x3F]),
    arch("Broadwell-EP", Vendor::Intel, true, 6, &[0x4F, 0x56]),
    Arch {
        steppings: (0, 4),
        ..arch("Skylake-SP", Vendor::Intel, true, 6, &[0x55])
    },
    Arch {
        steppings: (5, 7),
        ..arch("Cascade Lake-SP", Vendor::Intel, true, 6, &[0x55])
    },
    Arch {
        steppings: (8, u32::MAX),
        ..arch("Cooper Lake-SP", Vendor::Intel, true, 6, &[0x55])
    },
    arch("Ice Lake-SP", Vendor::Intel, true, 6, &[0x6A, 0x6C]),
    arch("Sapphire Rapids", Vendor::Intel, true, 6, &[0x8F]),
    arch("Emerald Rapids", Vendor::Intel, true, 6, &[0xCF]),
    arch("Sandy Bridge", Vendor::Intel, false, 6, &[0x2A]),
    arch("Ivy Bridge", Vendor::Intel, false, 6, &[0x3A]),
    arch("Haswell", Vendor::Intel, false, 6, &[0x3C, 0x45, 0x46]),
    arch("Broadwell", Vendor::Intel, false, 6, &[0x3D, 0x47]),
    arch("Skylake", Vendor::Intel, false, 6, &[0x4E, 0x5E]),
    arch("Kaby Lake", Vendor::Intel, false, 6, &[0x8E, 0x9E]),
    arch("Zen (Naples)", Vendor::Amd, true, 0x17, &[0x01]),
    arch("Zen 2 (Rome)", Vendor::Amd, true, 0x17, &[0x31]),
    arch("Zen 3 (Milan)", Vendor::Amd, true, 0x19, &[0x01]),
    arch("Zen 4 (Genoa)", Vendor::Amd, true, 0x19, &[0x11]),
];

/// The microarchitecture named `name` in [`ARCHS`].
pub fn arch_named(name: &str) -> Option<&'static Arch> {
    ARCHS.iter().find(|a| a.name == name)
}

/// The microarchitecture of a CPUID vendor/family/model/stepping.
pub fn arch_of_id(vendor: Vendor, family: u32, model: u32, stepping: u32) -> Option<&'static Arch> {
    ARCHS.iter().find(|a| {
        a.vendor == vendor
            && a.family == family
            && a.models.contains(&model)
            && (a.steppings.0..=a.steppings.1).contains(&stepping)
    })
}

/// A CPU name as the table keys it: lower case, without trademarks, `CPU`/`Processor`,
/// the vendor, an `N-Core` count or the `@ 2.90GHz` clock. `Intel(R) Xeon(R) Platinum
/// 8375C CPU @ 2.90GHz` → `xeon platinum 8375c`; `AMD EPYC 7B13 64-Core Processor` →
/// `epyc 7b13`.
pub fn normalise_name(name: &str) -> String {
    let lower = name.to_lowercase();
    let lower = lower.split('@').next().unwrap_or("");
    let cleaned = lower.replace("(r)", " ").replace("(tm)", " ");
    cleaned
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| {
            !w.is_empty()
                && !matches!(*w, "cpu" | "processor" | "intel" | "amd")
                && !w.ends_with("-core")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The vendor a CPU name implies.
pub fn vendor_of_name(name: &str) -> Option<Vendor> {
    let n = name.to_lowercase();
    if n.contains("intel") || n.contains("xeon") {
        Some(Vendor::Intel)
    } else if n.contains("amd") || n.contains("epyc") || n.contains("opteron") {
        Some(Vendor::Amd)
    } else {
        None
    }
}

/// The microarchitecture a CPU name implies, from the vendors' numbering: EPYC `7xxN`/
/// `9xxN` (N = generation), Xeon Scalable `Platinum/Gold/Silver/Bronze xGxx` (G =
/// generation; an `H` suffix of the third is Cooper Lake), Xeon `E5/E7-xxxx vN` and
/// `E3-xxxx vN`.
pub fn arch_of_name(name: &str) -> Option<&'static Arch> {
    let n = normalise_name(name);
    let words: Vec<&str> = n.split(' ').collect();
    let after = |key: &str| {
        words
            .iter()
            .position(|w| *w == key)
            .and_then(|i| words.get(i + 1))
    };
    if let Some(num) = after("epyc") {
        // `7702p`, `7r13`, `7b13`: four characters, then an optional suffix.
        let b = num.as_bytes();
        if b.len() >= 4 && b[0].is_ascii_digit() && b[3].is_ascii_digit() {
            let name = match (b[0], b[3]) {
                (b'7', b'1') => "Zen (Naples)",
                (b'7', b'2') => "Zen 2 (Rome)",
                (b'7', b'3') => "Zen 3 (Milan)",
                (b'9', b'4') => "Zen 4 (Genoa)",
                _ => return None,
            };
            return arch_named(name);
        }
        return None;
    }
    for tier in ["platinum", "gold", "silver", "bronze"] {
        if let Some(num) = after(tier) {
            let b = num.as_bytes();
            if b.len() < 4 || !b[..4].iter().all(u8::is_ascii_digit) {
                return None;
            }
            let suffix = &num[4..];
            let name = match b[1] {
                b'1' => "Skylake-SP",
                b'2' => "Cascade Lake-SP",
                b'3' if suffix.starts_with('h') => "Cooper Lake-SP",
                b'3' => "Ice Lake-SP",
                b'4' => "Sapphire Rapids",
                b'5' => "Emerald Rapids",
                _ => return None,
            };
            return arch_named(name);
        }
    }
    // `xeon e5-2670 v2`, `xeon e5-2670v2`, `xeon e3-1230`.
    let joined = n.replace(' ', "");
    for (prefix, server) in [("xeone5-", true), ("xeone7-", true), ("xeone3-", false)] {
        if let Some(pos) = joined.find(prefix) {
            let rest = &joined[pos + prefix.len()..];
            let version = rest
                .find('v')
                .and_then(|i| rest[i + 1..].chars().next())
                .and_then(|c| c.to_digit(10))
                .unwrap_or(1);
            let name = match (server, version) {
                (true, 1) => "Sandy Bridge-EP",
                (true, 2) => "Ivy Bridge-EP",
                (true, 3) => "Haswell-EP",
                (true, 4) => "Broadwell-EP",
                (false, 1) => "Sandy Bridge",
                (false, 2) => "Ivy Bridge",
                (false, 3) => "Haswell",
                (false, 4) => "Broadwell",
                (false, 5) => "Skylake",
                (false, 6) => "Kaby Lake",
                _ => return None,
            };
            return arch_named(name);
        }
    }
    None
}

/// What one prediction needs to know of a server.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Server {
    /// CPU sockets.
    pub chips: f64,
    /// Hardware threads of all chips.
    pub threads: f64,
    /// Memory, GB.
    pub memory_gb: f64,
    /// Nodes the figures are the sum of (SPECpower multi-node results; 1 otherwise).
    pub nodes: f64,
}

/// The regressors of one node of `server` for a CPU of `vendor` and class `server_class`
/// (an unknown vendor sits halfway between the two).
pub fn features(server: &Server, vendor: Option<Vendor>, server_class: bool) -> [f64; 6] {
    let nodes = server.nodes.max(1.0);
    let amd = match vendor {
        Some(Vendor::Amd) => 1.0,
        Some(Vendor::Intel) => 0.0,
        None => 0.5,
    };
    [
        (server.chips.max(1.0) / nodes).ln(),
        (server.memory_gb.max(1.0) / nodes).ln(),
        (server.threads.max(1.0) / nodes).ln(),
        1.0,
        amd,
        if server_class { 1.0 } else { 0.0 },
    ]
}

/// Names of the coefficients, in [`features`] order.
pub const COEFFICIENTS: [&str; 6] = [
    "ln_chips",
    "ln_memory_gb",
    "ln_threads",
    "const",
    "amd",
    "server",
];

/// A fitted composition: `ln(P/nodes) = coef · features`.
#[derive(Clone, Debug, PartialEq)]
pub struct Fit {
    /// Coefficients in [`COEFFICIENTS`] order.
    pub coef: [f64; 6],
}

impl Fit {
    /// Predicted wall watts of the whole `server`.
    pub fn watts(&self, server: &Server, vendor: Option<Vendor>, server_class: bool) -> f64 {
        let f = features(server, vendor, server_class);
        let ln: f64 = self.coef.iter().zip(f).map(|(c, x)| c * x).sum();
        server.nodes.max(1.0) * ln.exp()
    }
}

/// What a row says about the servers behind it.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// `cpu`, `arch` or `vendor`.
    pub level: Level,
    /// The key: a normalised CPU name, an arch name or a vendor + class
    /// (`Intel server`).
    pub key: String,
    /// Microarchitecture (`cpu` and `arch` rows).
    pub arch: Option<String>,
    /// Vendor.
    pub vendor: Vendor,
    /// Server class.
    pub server: bool,
    /// Measured servers behind the row (0: a known arch with none before the cut-off).
    pub servers: u32,
    /// Median measured idle watts per hardware thread.
    pub idle_w_per_thread: f64,
    /// Median measured full-load watts per hardware thread.
    pub full_w_per_thread: f64,
    /// Median absolute leave-one-out error at idle of the fit over the row's servers, %.
    pub idle_error_pct: f64,
    /// The same at full load, %.
    pub full_error_pct: f64,
    /// Median hardware threads per chip of the row's servers.
    pub threads_per_chip: f64,
    /// Median memory GB per hardware thread of the row's servers.
    pub gb_per_thread: f64,
}

/// Which kind of row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// A CPU model.
    Cpu,
    /// A microarchitecture.
    Arch,
    /// A vendor and class.
    Vendor,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Cpu => "cpu",
            Level::Arch => "arch",
            Level::Vendor => "vendor",
        }
    }
}

/// The parsed table.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// Provenance lines (`# source: …`).
    pub provenance: Vec<String>,
    /// Fit at active idle.
    pub idle: Fit,
    /// Fit at 100% load.
    pub full: Fit,
    /// Load curve exponent γ: P(u) = P_idle + (P_full − P_idle)·u^γ.
    pub curve_gamma: f64,
    /// Load curves γ was fitted from, and the range of their own γ.
    pub curve_note: String,
    /// Rows, most specific first within each level.
    pub rows: Vec<Row>,
}

/// A table that cannot be read: which line and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableError(pub String);

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TableError {}

fn num(field: Option<&str>, what: &str, line: usize) -> Result<f64, TableError> {
    let s = field.ok_or_else(|| TableError(format!("line {line}: missing {what}")))?;
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| TableError(format!("line {line}: {what} is not a number: {s:?}")))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(TableError(format!("line {line}: {what} is not finite")))
    }
}

impl Table {
    /// Parses a table's text: tab-separated lines `fit`, `curve` and `row`, `#` comments
    /// (those starting `# source:`, `# licence:`, `# built:` are kept as provenance).
    pub fn parse(text: &str) -> Result<Table, TableError> {
        if text.len() > MAX_TABLE_BYTES {
            return Err(TableError(format!(
                "table of {} bytes is over the {MAX_TABLE_BYTES}-byte cap",
                text.len()
            )));
        }
        let (mut idle, mut full, mut gamma) = (None, None, None);
        let mut table = Table {
            provenance: Vec::new(),
            idle: Fit { coef: [0.0; 6] },
            full: Fit { coef: [0.0; 6] },
            curve_gamma: 1.0,
            curve_note: String::new(),
            rows: Vec::new(),
        };
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if let Some(comment) = line.strip_prefix('#') {
                let c = comment.trim();
                if ["source:", "licence:", "built:", "commit:"]
                    .iter()
                    .any(|p| c.starts_with(p))
                {
                    table.provenance.push(c.to_string());
                }
                continue;
            }
            if line.trim().is_empty() {
                continue;
            }
            let mut f = line.split('\t');
            match f.next() {
                Some("fit") => {
                    let which = f.next();
                    let mut coef = [0.0; 6];
                    for (k, c) in coef.iter_mut().enumerate() {
                        *c = num(f.next(), COEFFICIENTS[k], n)?;
                    }
                    match which {
                        Some("idle") => idle = Some(Fit { coef }),
                        Some("full") => full = Some(Fit { coef }),
                        other => {
                            return Err(TableError(format!(
                                "line {n}: fit must be idle or full, not {other:?}"
                            )));
                        }
                    }
                }
                Some("curve") => {
                    let g = num(f.next(), "curve exponent", n)?;
                    if !(0.2..=5.0).contains(&g) {
                        return Err(TableError(format!(
                            "line {n}: curve exponent {g} outside 0.2..5"
                        )));
                    }
                    gamma = Some(g);
                    table.curve_note = f.next().unwrap_or("").to_string();
                }
                Some("row") => {
                    if table.rows.len() >= MAX_ROWS {
                        return Err(TableError(format!("line {n}: more than {MAX_ROWS} rows")));
                    }
                    table.rows.push(parse_row(&mut f, n)?);
                }
                other => {
                    return Err(TableError(format!(
                        "line {n}: expected fit, curve or row, found {other:?}"
                    )));
                }
            }
        }
        table.idle = idle.ok_or_else(|| TableError("no `fit idle` line".into()))?;
        table.full = full.ok_or_else(|| TableError("no `fit full` line".into()))?;
        table.curve_gamma = gamma.ok_or_else(|| TableError("no `curve` line".into()))?;
        for v in [Vendor::Intel, Vendor::Amd] {
            if !table
                .rows
                .iter()
                .any(|r| r.level == Level::Vendor && r.vendor == v && r.server)
            {
                return Err(TableError(format!(
                    "no vendor row for {} servers",
                    v.as_str()
                )));
            }
        }
        Ok(table)
    }

    /// The table as text ([`Table::parse`] reads it back).
    pub fn to_text(&self, header: &[String]) -> String {
        let mut out = String::new();
        for h in header {
            out.push_str(&format!("# {h}\n"));
        }
        for (name, fit) in [("idle", &self.idle), ("full", &self.full)] {
            out.push_str("fit\t");
            out.push_str(name);
            for c in fit.coef {
                out.push_str(&format!("\t{c:.6}"));
            }
            out.push('\n');
        }
        out.push_str(&format!(
            "curve\t{:.3}\t{}\n",
            self.curve_gamma, self.curve_note
        ));
        out.push_str(
            "# row\tlevel\tkey\tarch\tvendor\tserver\tservers\tidle_w_per_thread\tfull_w_per_thread\tidle_error_pct\tfull_error_pct\tthreads_per_chip\tgb_per_thread\n",
        );
        for r in &self.rows {
            out.push_str(&format!(
                "row\t{}\t{}\t{}\t{}\t{}\t{}\t{:.3}\t{:.3}\t{:.1}\t{:.1}\t{:.0}\t{:.2}\n",
                r.level.as_str(),
                r.key,
                r.arch.as_deref().unwrap_or("-"),
                r.vendor.as_str(),
                u8::from(r.server),
                r.servers,
                r.idle_w_per_thread,
                r.full_w_per_thread,
                r.idle_error_pct,
                r.full_error_pct,
                r.threads_per_chip,
                r.gb_per_thread
            ));
        }
        out
    }

    /// The row for a level and key.
    pub fn row(&self, level: Level, key: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.level == level && r.key == key)
    }

    /// The vendor row of `vendor` and class.
    pub fn vendor_row(&self, vendor: Vendor, server: bool) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.level == Level::Vendor && r.vendor == vendor && r.server == server)
    }
}

fn parse_row<'a>(f: &mut impl Iterator<Item = &'a str>, n: usize) -> Result<Row, TableError> {
    let mut text = |what: &str| {
        f.next()
            .map(str::to_string)
            .ok_or_else(|| TableError(format!("line {n}: missing {what}")))
    };
    let level = match text("level")?.as_str() {
        "cpu" => Level::Cpu,
        "arch" => Level::Arch,
        "vendor" => Level::Vendor,
        other => return Err(TableError(format!("line {n}: unknown row level {other:?}"))),
    };
    let key = text("key")?;
    let arch = Some(text("arch")?).filter(|a| a != "-");
    let vendor_s = text("vendor")?;
    let vendor = Vendor::parse(&vendor_s)
        .ok_or_else(|| TableError(format!("line {n}: unknown vendor {vendor_s:?}")))?;
    let server = text("server")? == "1";
    let mut numbers = [0.0; 7];
    let names = [
        "servers",
        "idle_w_per_thread",
        "full_w_per_thread",
        "idle_error_pct",
        "full_error_pct",
        "threads_per_chip",
        "gb_per_thread",
    ];
    for (v, what) in numbers.iter_mut().zip(names) {
        *v = num(Some(&text(what)?), what, n)?;
        if *v < 0.0 {
            return Err(TableError(format!("line {n}: {what} is negative")));
        }
    }
    Ok(Row {
        level,
        key,
        arch,
        vendor,
        server,
        servers: numbers[0] as u32,
        idle_w_per_thread: numbers[1],
        full_w_per_thread: numbers[2],
        idle_error_pct: numbers[3],
        full_error_pct: numbers[4],
        threads_per_chip: numbers[5],
        gb_per_thread: numbers[6],
    })
}

/// A CPU name matched to the table: the row used and the path that led to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Match<'t> {
    /// The row whose error (and typical server) is used.
    pub row: &'t Row,
    /// Vendor of the CPU (None: unknown, the fit sits between Intel and AMD).
    pub vendor: Option<Vendor>,
    /// Server class.
    pub server: bool,
    /// How the name was matched, e.g. `Intel Xeon Platinum 8375C → Ice Lake-SP (no
    /// servers before 2020) → Intel server`.
    pub path: String,
}

impl Table {
    /// Matches a CPU: its normalised name to a `cpu` row; else the microarchitecture (from
    /// the name's numbering, else `id_arch` from CPUID family/model) to an `arch` row with
    /// servers; else the vendor (from the name, else `vendor_hint`, CPUID's) and class.
    pub fn lookup(
        &self,
        cpu_name: &str,
        id_arch: Option<&'static Arch>,
        vendor_hint: Option<Vendor>,
    ) -> Match<'_> {
        // The name as people write it: no trademarks, `CPU`, `Processor`, core count or clock.
        let shown = cpu_name.split('@').next().unwrap_or("");
        let shown = shown
            .replace("(R)", " ")
            .replace("(TM)", " ")
            .replace("(tm)", " ");
        let shown = shown
            .split_whitespace()
            .filter(|w| {
                let w = w.to_lowercase();
                !matches!(w.as_str(), "cpu" | "processor") && !w.ends_with("-core")
            })
            .collect::<Vec<_>>()
            .join(" ");
        let key = normalise_name(cpu_name);
        if let Some(row) = self.row(Level::Cpu, &key) {
            return Match {
                row,
                vendor: Some(row.vendor),
                server: row.server,
                path: format!("{shown} → {}", row.arch.as_deref().unwrap_or(&row.key)),
            };
        }
        let arch = arch_of_name(cpu_name).or(id_arch);
        if let Some(arch) = arch {
            if let Some(row) = self.row(Level::Arch, arch.name).filter(|r| r.servers > 0) {
                return Match {
                    row,
                    vendor: Some(arch.vendor),
                    server: arch.server,
                    path: format!("{shown} → {}", arch.name),
                };
            }
            if let Some(row) = self.vendor_row(arch.vendor, arch.server) {
                return Match {
                    row,
                    vendor: Some(arch.vendor),
                    server: arch.server,
                    path: format!(
                        "{shown} → {} (no servers before the table's cut-off) → {}",
                        arch.name, row.key
                    ),
                };
            }
        }
        let vendor = vendor_of_name(cpu_name).or(vendor_hint);
        // A name with no vendor in it: assume a server part (VMs run on servers), halfway
        // between the vendors, with the wider of their two errors.
        let row = match vendor {
            Some(v) => self.vendor_row(v, true),
            None => [Vendor::Intel, Vendor::Amd]
                .iter()
                .filter_map(|&v| self.vendor_row(v, true))
                .max_by(|a, b| a.full_error_pct.total_cmp(&b.full_error_pct)),
        };
        let row = row.unwrap_or(&self.rows[0]);
        Match {
            row,
            vendor,
            server: true,
            path: format!(
                "{} → unknown CPU → {}",
                if shown.is_empty() {
                    "no CPU name"
                } else {
                    &shown
                },
                if vendor.is_some() {
                    row.key.as_str()
                } else {
                    "Intel/AMD server average"
                }
            ),
        }
    }
}
