//! `energy-bpf agent`: the always-on daemon (docs/ARCHITECTURE.md, "Agent"). It captures
//! continuously, closes a window every interval, and hands every chunk and window to its
//! [`Sink`]s: the Prometheus [`metrics`], and through [`extra_sinks`] the Unix-socket
//! snapshot server and the rotating recorder ([`outputs`]).
//!
//! Threads: a single-threaded tokio runtime runs the HTTP server and waits for signals;
//! the capture loop ([`collect`]) owns the probes and the pipeline on a blocking thread.
//! SIGTERM/SIGINT finish the current window, flush the sinks and return; SIGHUP asks the
//! caller for fresh settings and applies what can change live (interval, series limit).

pub(crate) mod collect;
pub(crate) mod config;
pub(crate) mod health;
mod http;
pub(crate) mod learn;
pub(crate) mod ledger;
pub(crate) mod metrics;
pub(crate) mod otlp;
pub(crate) mod outputs;
pub(crate) mod selfstat;
pub(crate) mod settings;
pub(crate) mod stacks;
pub(crate) mod vm_dir;
pub(crate) mod vms;
pub(crate) mod web;
// The seam lives below its users, with the capture: `record` pushes into it too.
pub(crate) use crate::capture::sink;

use std::sync::{Arc, mpsc};

use tokio::signal::unix::{SignalKind, signal};

pub use settings::{OtlpSettings, RecordSettings, Retain, Settings};
pub use sink::Sink;

use crate::capture::Capture;

/// Re-reads the settings (flags and the config file) on SIGHUP; the error is logged and
/// the running settings kept.
pub type Reload = Box<dyn Fn() -> Result<Settings, String> + Send>;

/// Why the agent could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The async runtime or the signal handlers could not be set up.
    #[error("{what}")]
    Setup {
        /// What was being set up.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The snapshot socket could not be bound.
    #[error("cannot serve snapshots on {} (choose another with --socket)", path.display())]
    Socket {
        /// The socket path.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: crate::remote::RemoteError,
    },
    /// The OTLP exporter could not start.
    #[error("cannot export OTLP profiles")]
    Otlp(#[source] otlp::transport::ExportError),
    /// The OTLP encoder thread could not start.
    #[error("cannot start the OTLP encoder thread")]
    OtlpThread(#[source] std::io::Error),
    /// The metrics registry could not be built.
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
    /// Pod names were asked for and cannot be had.
    #[error("cannot name pods")]
    Kube(#[source] crate::kube::KubeError),
    /// The metrics address could not be bound.
    #[error("cannot listen on {addr} for /metrics (choose another with --metrics-addr, or port 0)")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Capture could not start.
    #[error(transparent)]
    Capture(#[from] crate::capture::LiveError),
    /// The web view was asked for where it would be exposed without a token.
    #[error("{0}")]
    Exposed(String),
    /// The capture thread ended before it said whether capture started.
    #[error("the capture thread ended during start-up")]
    CaptureEnded,
    /// The capture thread panicked.
    #[error("the capture thread panicked")]
    Panicked(#[source] tokio::task::JoinError),
    /// The capture loop returned although no signal asked it to.
    #[error("the capture loop stopped on its own")]
    Stopped,
}

/// Runs the agent until SIGTERM or SIGINT.
pub fn run(settings: Settings, reload: Reload) -> Result<(), AgentError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .thread_name("energy-bpf-agent")
        .build()
        .map_err(|source| AgentError::Setup {
            what: "starting the async runtime",
            source,
        })?
        .block_on(serve(settings, reload))
}

/// The per-window consumers beside the metrics, built from the settings: the seam for the
/// snapshot server (`settings.socket`) and the rotating recorder (`settings.record`). Each
/// is a [`Sink`]; work that may block (clients, disk) belongs on a thread or a task on
/// `runtime`, not in the sink's methods.
pub fn extra_sinks(
    settings: &Settings,
    runtime: &tokio::runtime::Handle,
    names: Option<Arc<crate::kube::Resolver>>,
) -> Result<Vec<Box<dyn Sink>>, AgentError> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    let server =
        crate::remote::Server::bind(&settings.socket).map_err(|source| AgentError::Socket {
            path: settings.socket.clone(),
            source,
        })?;
    sinks.push(Box::new(outputs::SocketSink::new(server)));
    if let Some(record) = &settings.record {
        // Files of a minute (8 MiB at most): the web view reads a range's files, at most
        // `web::api::MAX_READ_BYTES` of them, so the files are small beside that cap.
        let rotation = crate::record::rotate::Rotation {
            retain: record.retain,
            max_file_bytes: 8 << 20,
            max_file_age: std::time::Duration::from_secs(60),
        };
        sinks.push(Box::new(crate::record::Recorder::new(
            crate::record::Target::Rotating(record.dir.clone(), rotation),
        )));
    }
    if let Some(otlp) = &settings.otlp {
        let exporter = otlp::transport::Exporter::spawn(otlp.export.clone(), runtime)
            .map_err(AgentError::Otlp)?;
        tracing::info!(
            "exporting energy profiles every {:?} to {}",
            otlp.profile_interval,
            otlp.export.endpoint
        );
        sinks.push(Box::new(
            otlp::OtlpSink::new(exporter, otlp.profile_interval)
                .map_err(AgentError::OtlpThread)?
                .with_names(names),
        ));
    }
    Ok(sinks)
}

async fn serve(settings: Settings, reload: Reload) -> Result<(), AgentError> {
    // Signals first: a SIGTERM during start-up must not kill the process mid-attach.
    let handler = |kind| {
        signal(kind).map_err(|source| AgentError::Setup {
            what: "installing signal handlers",
            source,
        })
    };
    let mut term = handler(SignalKind::terminate())?;
    let mut int = handler(SignalKind::interrupt())?;
    let mut hup = handler(SignalKind::hangup())?;
    if !crate::capture::host::has_capability(crate::capture::host::CAP_SYS_PTRACE) {
        tracing::warn!(
            "missing CAP_SYS_PTRACE: other users' processes get no unwind tables or symbols (their /proc/<pid>/maps and /proc/<pid>/root are closed); their stacks use frame pointers"
        );
    }
    web::check_exposure(
        settings.metrics_addr,
        settings.web.token.as_deref(),
        settings.web.enabled,
    )
    .map_err(AgentError::Exposed)?;
    let metrics = metrics::Metrics::new(settings.max_process_series)?;
    let names = match &settings.kube {
        Some(kube) => {
            let resolver = Arc::new(crate::kube::Resolver::start(kube).map_err(AgentError::Kube)?);
            metrics.set_names(Arc::clone(&resolver));
            Some(resolver)
        }
        None => None,
    };
    let (listener, addr) =
        http::bind(settings.metrics_addr)
            .await
            .map_err(|source| AgentError::Listen {
                addr: settings.metrics_addr,
                source,
            })?;
    let mut sinks: Vec<Box<dyn Sink>> = vec![
        Box::new(metrics::MetricsSink::new(Arc::clone(&metrics))),
        Box::new(vms::VmSink::new(
            settings.vm.clone(),
            settings.interval,
            Arc::clone(&metrics),
        )),
    ];
    let view = settings.web.enabled.then(|| {
        web::WebView::new(
            settings.record.as_ref().map(|r| r.dir.clone()),
            settings.web.token.clone(),
        )
    });
    if let Some(view) = &view {
        sinks.push(Box::new(
            web::WebSink::new(Arc::clone(view)).with_names(names.clone()),
        ));
    }
    sinks.extend(extra_sinks(
        &settings,
        &tokio::runtime::Handle::current(),
        names,
    )?);

    let (control, control_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<(), AgentError>>();
    let live = settings.live.clone();
    let interval = settings.interval;
    let capture_metrics = Arc::clone(&metrics);
    let health = Arc::new(health::Health::new());
    let capture_health = Arc::clone(&health);
    // Served from the start: `/healthz` and `/readyz` say 503 while the probes load.
    let server = tokio::spawn(http::serve(
        listener,
        Arc::clone(&metrics),
        Arc::clone(&health),
        view,
    ));
    let state_dir = settings.state_dir.clone();
    let mut capture = tokio::task::spawn_blocking(move || match Capture::start(&live) {
        Ok(capture) => {
            let _ = ready_tx.send(Ok(()));
            let learner = learn::Learner::open(&state_dir, &capture.header().hostname);
            collect::Collector::new(capture, sinks, capture_metrics, interval)
                .learning(learner)
                .health(capture_health)
                .run(&control_rx);
        }
        Err(err) => {
            let _ = ready_tx.send(Err(err.into()));
        }
    });
    let started = ready_rx.await.map_err(|_| AgentError::CaptureEnded);
    if let Err(err) = started.and_then(|r| r) {
        server.abort();
        return Err(err);
    }
    tracing::info!(
        "energy-bpf agent: {} s windows, metrics at http://{addr}/metrics",
        interval.as_secs_f64()
    );

    let mut current = settings;
    loop {
        tokio::select! {
            _ = term.recv() => {
                tracing::info!("SIGTERM: finishing the current window");
                break;
            }
            _ = int.recv() => {
                tracing::info!("SIGINT: finishing the current window");
                break;
            }
            _ = hup.recv() => match reload() {
                Ok(new) => {
                    apply_reload(&current, &new, &control);
                    current = new;
                }
                Err(err) => tracing::warn!("SIGHUP: keeping the running settings: {err}"),
            },
            ended = &mut capture => {
                server.abort();
                ended.map_err(AgentError::Panicked)?;
                return Err(AgentError::Stopped);
            }
        }
    }
    // The receiver only goes away when the loop has ended, which the join below reports.
    let _ = control.send(collect::Control::Stop);
    capture.await.map_err(AgentError::Panicked)?;
    server.abort();
    tracing::info!("stopped");
    Ok(())
}

/// Sends what can change live to the capture loop, and says what needs a restart.
fn apply_reload(old: &Settings, new: &Settings, control: &mpsc::Sender<collect::Control>) {
    let _ = control.send(collect::Control::Reload {
        interval: new.interval,
        max_series: new.max_process_series,
    });
    let restart: Vec<&str> = [
        ("--metrics-addr", old.metrics_addr != new.metrics_addr),
        ("--socket", old.socket != new.socket),
        ("--record-dir/--retain", old.record != new.record),
        ("--state-dir", old.state_dir != new.state_dir),
        ("--kube-*", old.kube != new.kube),
        (
            "energy source and capture flags",
            format!(
                "{:?}",
                (old.live.sample_hz, &old.live.energy, &old.live.attribute)
            ) != format!(
                "{:?}",
                (new.live.sample_hz, &new.live.energy, &new.live.attribute)
            ),
        ),
    ]
    .into_iter()
    .filter_map(|(name, changed)| changed.then_some(name))
    .collect();
    if !restart.is_empty() {
        tracing::warn!(
            "SIGHUP: {} changed; they take effect on restart",
            restart.join(", ")
        );
    }
}
