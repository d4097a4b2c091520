//! Integration tests: one binary, modules by capability. They run the real `energy-bpf`
//! binary and the real eBPF probes on the running kernel, so they need root (CI is root).
//! A test that cannot run prints why instead of passing silently.

// Shared helpers: the binary, temp dirs, workloads.
mod util;
// Exact busy time of CPUs and processes from the kernel's context-switch records.
mod switch_clock;
// The aggregating mode against the exact stream, on this kernel.
mod aggregate;

// Capture: real probes on this kernel, rebuilt timeline vs known workloads.
mod capture;
// The per-run activity counter: a software event through the real sched_switch probe.
mod activity;
// Bad input and missing privileges: clear errors, nothing lost.
mod errors;
// User stacks by unwind tables: C, Rust and python3 built without frame pointers.
mod unwind;
// CPython frames walked in eBPF: Debian python3 and pyenv 3.9-3.13, energy per function.
mod python;
// Damaged recordings: damage reported, memory bounded.
mod damage;
// Output files: modes, planted symlinks, a full disk.
mod files;
// The command line as a new user meets it: a typo keeps the last recording, nonsense values
// refused, the help's JSON fields checked against output, no SVG on a terminal.
mod cli;
// The documentation stays true: links resolve, README's commands use real flags and run,
// the agent's metrics reference matches a real /metrics.
mod docs;
// Energy readings from fake RAPL trees through the real record path.
mod energy;
// Attribution end to end: emulated RAPL driven by real CPU time, real probes.
mod attribution;
// Never-idle machines: a 1 kHz emulated counter following every CPU's exact busy time;
// a 10 ms duty cycle beside a spinner, and three always-runnable processes after calibrate.
mod never_idle;
// One pipeline: report, report --window and top --replay agree per process.
mod pipeline;
// `calibrate`: quiet-machine static power, refusal when busy, used by record and report.
mod calibrate;
// Golden report outputs: table, JSON and CSV of a fixed recording, byte for byte.
mod golden;
// Exporters: flamegraph SVG in Chromium, pprof in `go tool pprof`, on our workload.
mod outputs;
// Symbols resolved a file at a time up front equal those looked up one address at a time.
mod symbols;
// `diff`: an A/B of a fixed-work C program through the real probes, `record --repeat`,
// the differential flamegraph in Chromium, the CI gate, bad input.
mod diff;
// OTLP profiles, decoded by a receiver built from the official definitions.
mod otlp;
// JIT code (Node, Java) named from perf maps after the process and its map are gone.
mod jit;
// `top` in tmux: a pinned busy process on top within three refreshes, sort keys, clean exit.
mod top_tmux;
// The agent scraped by a real Prometheus: shares, per-zone sums, monotonic counters.
mod agent;
// The agent learns static power from varying load and keeps it across restarts.
mod learn;
// `calibrate --roofline`: the energy roofline fit against an emulated package driven by the
// kernels' progress, the estimated model, the plot in Chromium, no cpufreq.
mod roofline;
// Run counters for the per-function roofline: software events through the real probes,
// counts per interval and per function; `report --roofline` without a hardware PMU.
mod run_counts;
// Kubernetes: manifests pass strict schema validation; the agent as nobody with only the
// DaemonSet's capabilities; pod names from a fake kubelet.
mod k8s;
// kustomize: `kubectl kustomize deploy/kubernetes` renders exactly the validated manifests;
// the GPU overlay adds only its patch; namespace and image are kustomize fields.
mod kustomize;
// Pod, namespace and container names from a fake kubelet over HTTPS, real cgroups.
mod k8s_names;
// The agent in its own cgroup and mount namespaces with the DaemonSet's mounts and config.
mod k8s_container;
// Grafana dashboards: every panel's query returns data from a real Prometheus scraping the
// agent; no metric, label or unit the agent does not have.
mod grafana;
// Virtual machines on the host: fake VMs of real processes with vCPU-named threads, their
// directories for the guest, conservation, agent restarts and VMs that exit.
mod vm_host;
// A real qemu guest reads its measured energy from the host's read-only share: totals,
// the per-process split, the share read-only, a host restart flagged.
mod vm_guest;

// Grams of CO2e: an intensity step served over HTTPS on loopback, a failing live source,
// and `sci` against `report`.
mod carbon;
// The agent's web view in headless Chromium: two processes at 3:1 charted, the heavier
// one's flamegraph, a comparison; the token, the caps and the CSP.
mod webview;
