//! One module per subcommand: its clap `Args` and a `run` that returns the exit code.
//! Each is a thin shell over the library modules.

pub mod agent;
pub(crate) mod args;
pub mod assets;
pub mod calibrate;
pub mod diff;
pub mod flamegraph;
pub mod kernel;
pub mod model;
pub mod record;
pub mod report;
mod roofline;
mod run_counters;
pub mod sci;
pub mod sources;
pub mod top;
