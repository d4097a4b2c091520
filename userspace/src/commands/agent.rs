//! `energy-bpf agent`: flags and the TOML config file merged into
//! `crate::agent::Settings`; the daemon itself lives in `crate::agent`.
//!
//! The config file (`crate::agent::config`) gives flags; they are parsed before the
//! command line's, and the later flag wins: flags given on the command line beat the file.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::Context as _;
use clap::{Args as _, FromArgMatches as _};

use crate::{
    agent::{self, RecordSettings, Retain, Settings, settings::parse_metrics_addr},
    capture::LiveConfig,
    commands::args::AttributeArgs,
};

/// Arguments of `energy-bpf agent`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// TOML file of settings whose keys are the long flag names (`interval = 5`,
    /// `energy-source = "model"`); flags on the command line win. Re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Seconds between updates: here one window of attribution is closed and exported (in
    /// `top`, `-i` is the same beat: a refresh of the view).
    #[arg(short = 'i', long, value_name = "SECS", default_value_t = 5.0, value_parser = parse_interval)]
    pub(crate) interval: f64,
    /// Address of the Prometheus `/metrics` endpoint; `:PORT` is loopback, port 0 picks a
    /// free port (logged at start).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9102", value_parser = parse_addr)]
    pub(crate) metrics_addr: SocketAddr,
    /// At most this many processes get series of their own; the rest are `comm="[other]"`.
    #[arg(long, value_name = "N", default_value_t = 500)]
    pub(crate) max_process_series: usize,
    /// Unix socket serving window snapshots to `top`.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/run/energy-bpf/agent.sock"
    )]
    pub(crate) socket: PathBuf,
    /// Write rotating recordings into this directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) record_dir: Option<PathBuf>,
    /// How much of the rotating recordings to keep: an age (`24h`, `7d`) or a size
    /// (`10GiB`); default 7 days.
    #[arg(long, value_name = "DURATION|SIZE", requires = "record_dir")]
    pub(crate) retain: Option<Retain>,
    /// How runs reach the agent: `aggregate` (the default) sums each thread's on-CPU time
    /// per CPU and poll in the kernel, so the agent's cost follows the number of active
    /// threads, not of context switches; `stream` sends every switch, as `record` does.
    /// `--record-dir` always streams: recordings hold every switch.
    #[arg(long, value_name = "MODE", value_enum, default_value_t = super::args::SwitchesMode::Aggregate)]
    pub(crate) switches: super::args::SwitchesMode,
    /// Stack-sampling frequency in Hz (stacks feed the recordings; energy comes from the
    /// scheduler timeline whatever the rate). 49 by default, below `record`'s 99: the agent
    /// runs always and shows stacks in aggregate.
    #[arg(short = 'F', long = "freq", value_name = "HZ", default_value_t = 49,
          value_parser = super::args::hz)]
    pub(crate) freq: u32,
    /// Energy sources (counters, fake trees for testing, model parameters).
    #[command(flatten)]
    pub(crate) energy: super::args::EnergyFlags,
    /// How energy is split between threads. `auto` fits each window's split on the last two
    /// minutes of windows, as `top` does: a per-class regression needs minutes of intervals,
    /// and a window has seconds.
    #[command(flatten)]
    pub(crate) attribute: AttributeArgs,
    /// Send energy profiles over OTLP/gRPC to this collector (`http://127.0.0.1:4317`;
    /// plaintext only to loopback unless --otlp-insecure; `https://` uses the system's roots).
    #[arg(long, value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
    /// gRPC metadata sent with every export, e.g. `authorization=Bearer TOKEN` (repeat for
    /// more; values are never logged).
    #[arg(long, value_name = "K=V", value_parser = crate::agent::otlp::transport::parse_header)]
    pub(crate) otlp_header: Vec<(String, String)>,
    /// Allow plaintext http:// to a collector that is not on loopback.
    #[arg(long)]
    pub(crate) otlp_insecure: bool,
    /// Seconds of windows per exported profile.
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = parse_interval)]
    pub(crate) profile_interval: f64,
    /// The per-run activity counter.
    #[command(flatten)]
    pub(crate) activity: super::args::ActivityArgs,
    /// How user stacks are walked.
    #[command(flatten)]
    pub(crate) unwind: super::args::UnwindArgs,
    /// Static power measured by `energy-bpf calibrate` (the default file when it exists).
    #[command(flatten)]
    pub(crate) calibration: super::args::CalibrationFlags,
    /// Directory of state kept across restarts: the quietest intervals static power is
    /// learned from (`static-learned.json`, mode 0600).
    #[arg(long, value_name = "DIR", default_value = crate::agent::learn::store::DEFAULT_STATE_DIR)]
    pub(crate) state_dir: PathBuf,
    /// Name pods, namespaces and containers from this pod list: the API server's
    /// `https://kubernetes.default.svc/api/v1/pods?fieldSelector=spec.nodeName%3DNODE`
    /// (RBAC: list pods) or the kubelet's `https://NODE_IP:10250/pods`.
    #[arg(long, value_name = "URL", requires = "kube_ca")]
    pub(crate) kube_pods_url: Option<String>,
    /// PEM file of the CA that signed the pod list server's certificate.
    #[arg(long, value_name = "FILE")]
    pub(crate) kube_ca: Option<PathBuf>,
    /// File holding the bearer token sent with the request (the service account's).
    #[arg(long, value_name = "FILE")]
    pub(crate) kube_token: Option<PathBuf>,
    /// File holding the bearer token the web view's API asks for; needed to serve the web
    /// view on an address other than loopback.
    #[arg(long, value_name = "FILE")]
    pub(crate) web_token_file: Option<PathBuf>,
    /// Serve /metrics and the probes only, without the web view at `/`.
    #[arg(long)]
    pub(crate) no_web: bool,
    /// Directory of per-VM energy directories (`NAME/` laid out like a powercap tree, to
    /// share read-only into each guest), or `none`.
    #[arg(long, value_name = "DIR|none", default_value = crate::agent::vms::DEFAULT_SHARE)]
    pub(crate) vm_share: String,
    /// How the host's static power is shared out to VMs: `vcpus` (by allotted vCPUs over
    /// the host's logical CPUs), `busy` (by their share of busy time) or `none`.
    #[arg(long, value_name = "POLICY", default_value = "vcpus",
          value_parser = clap::builder::ValueParser::new(str::parse::<crate::vm::StaticPolicy>))]
    pub(crate) vm_static: crate::vm::StaticPolicy,
    /// Grams of CO2e per process, container and node on /metrics.
    #[command(flatten)]
    pub(crate) carbon: crate::carbon::cli::CarbonArgs,
}

fn parse_interval(text: &str) -> Result<f64, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(0.5..=3600.0).contains(&secs) {
        return Err(format!(
            "interval must be between 0.5 and 3600 seconds, got {secs}"
        ));
    }
    Ok(secs)
}

fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    parse_metrics_addr(text).map_err(|e| e.to_string())
}

impl Args {
    /// The settings these arguments select (reading the calibration file they name).
    pub(crate) fn settings(&self) -> anyhow::Result<Settings> {
        let mut attribute = self.attribute.options();
        let (_, hostname) = crate::capture::host::uname();
        attribute.calibrated = self
            .calibration
            .config()
            .resolve(&hostname)
            .context("cannot use the calibration")?;
        let attribute = attribute.live();
        let interval = Duration::from_secs_f64(self.interval);
        crate::capture::probe_log::enable(self.unwind.debug_probes);
        Ok(Settings {
            interval,
            metrics_addr: self.metrics_addr,
            max_process_series: self.max_process_series,
            live: LiveConfig {
                sample_hz: u64::from(self.freq),
                interval,
                energy: self.energy.config(),
                attribute,
                activity: self.activity.event,
                unwind: self.unwind.mode,
                // The agent drains every second; eight seconds of samples leave room for
                // a stalled poll without holding 32 MiB of ring in RSS for a slow rate.
                sample_ring_bytes: Some(crate::capture::sample_ring_bytes(
                    u64::from(self.freq),
                    std::thread::available_parallelism().map_or(1, usize::from),
                    Duration::from_secs(8),
                )),
                aggregate: self.switches == super::args::SwitchesMode::Aggregate
                    && self.record_dir.is_none(),
            },
            socket: self.socket.clone(),
            state_dir: self.state_dir.clone(),
            kube: self.kube_pods_url.as_ref().and_then(|url| {
                Some(crate::kube::KubeSettings {
                    pods_url: url.clone(),
                    ca: self.kube_ca.clone()?,
                    token: self.kube_token.clone(),
                })
            }),
            otlp: self
                .otlp_endpoint
                .as_ref()
                .map(|endpoint| crate::agent::OtlpSettings {
                    export: crate::agent::otlp::transport::ExportConfig {
                        endpoint: endpoint.clone(),
                        headers: self.otlp_header.clone(),
                        insecure: self.otlp_insecure,
                        ..Default::default()
                    },
                    profile_interval: Duration::from_secs_f64(self.profile_interval),
                }),
            vm: crate::agent::vms::VmSettings {
                share: (self.vm_share != "none").then(|| PathBuf::from(&self.vm_share)),
                policy: self.vm_static,
            },
            web: crate::agent::web::WebSettings {
                enabled: !self.no_web,
                token: self
                    .web_token_file
                    .as_deref()
                    .map(crate::agent::web::read_token)
                    .transpose()
                    .map_err(anyhow::Error::msg)?,
            },
            record: self.record_dir.as_ref().map(|dir| RecordSettings {
                dir: dir.clone(),
                retain: self
                    .retain
                    .unwrap_or(crate::record::rotate::Rotation::default().retain),
            }),
        })
    }
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // What followed `agent` on the command line, to lay over the config file again on
    // every SIGHUP.
    let cli: Vec<String> = std::env::args()
        .skip_while(|a| a != "agent")
        .skip(1)
        .collect();
    let args = match &args.config {
        Some(path) => merged(path, &cli)?,
        None => args,
    };
    let config = args.config.clone();
    let reload: agent::Reload = Box::new(move || {
        let settings = match &config {
            Some(path) => merged(path, &cli).and_then(|args| args.settings()),
            None => Err(anyhow::anyhow!("no --config file to reload")),
        };
        settings.map_err(|err| format!("{err:#}"))
    });
    if let Some(c) = args.carbon.carbon()? {
        crate::agent::metrics::carbon::set_source(c);
    }
    agent::run(args.settings()?, reload)?;
    Ok(ExitCode::SUCCESS)
}

/// The config file's settings overlaid by the command line's.
fn merged(path: &Path, cli: &[String]) -> anyhow::Result<Args> {
    let file = agent::config::read_flags(path)?;
    parse_layered(&file, cli).with_context(|| {
        format!(
            "{} and the command line do not make valid settings",
            path.display()
        )
    })
}

/// Parses `file` flags then `cli` flags as one `agent` command line; the later flag wins.
fn parse_layered(file: &[String], cli: &[String]) -> anyhow::Result<Args> {
    let cmd = Args::augment_args(clap::Command::new("agent").no_binary_name(true))
        .args_override_self(true);
    let matches = cmd
        .try_get_matches_from(file.iter().chain(cli))
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim()))?;
    Ok(Args::from_arg_matches(&matches)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::PowerModel;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn command_line_beats_the_file() {
        let file = strings(&[
            "--interval=2",
            "--max-process-series=10",
            "--energy-source=model",
        ]);
        let args = parse_layered(&file, &strings(&["--interval", "7"])).expect("valid");
        assert_eq!(args.interval, 7.0);
        assert_eq!(args.max_process_series, 10);
        assert_eq!(args.energy.energy_source, crate::energy::SourceKind::Model);
        let s = args.settings().expect("settings");
        assert_eq!(s.interval, Duration::from_secs(7));
        assert_eq!(s.metrics_addr.to_string(), "127.0.0.1:9102");
        assert_eq!(s.live.attribute.power_model, PowerModel::Auto);
        assert!(
            s.live.attribute.history.is_some(),
            "auto fits over past windows"
        );
        assert!(s.record.is_none());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let err = parse_layered(&strings(&["--no-such-flag=1"]), &[]).expect_err("unknown");
        assert!(err.to_string().contains("no-such-flag"), "{err}");
        assert!(parse_layered(&strings(&["--interval=0"]), &[]).is_err());
        assert!(
            parse_layered(&strings(&["--retain=1d"]), &[]).is_err(),
            "needs --record-dir"
        );
        let args =
            parse_layered(&strings(&["--record-dir=/tmp/r", "--retain=2GiB"]), &[]).expect("valid");
        assert_eq!(
            args.settings().expect("settings").record.map(|r| r.retain),
            Some(Retain::Size(2 << 30))
        );
    }
}
