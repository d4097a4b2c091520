//! The carbon flags every command that can print grams shares (`report`, `top`, `agent`,
//! `flamegraph`, `diff`, `sci`), and the [`Carbon`] they make.

use std::{path::PathBuf, time::Duration};

use super::{Carbon, Source, live, series::Series, zones};

/// Carbon: grams of CO2e beside joules (docs/carbon.md).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct CarbonArgs {
    /// Grid intensity, gCO2e/kWh, for all time (with --carbon-api: the value to fall back to).
    #[arg(long, value_name = "G_PER_KWH", value_parser = parse_intensity)]
    pub carbon_intensity: Option<f64>,
    /// Grid zone or cloud region: its yearly average from the built-in table (`FR`, `DE`,
    /// `US-CAL-CISO`, `aws:eu-west-3`); with --carbon-api, the zone asked for.
    #[arg(long, value_name = "ZONE")]
    pub carbon_zone: Option<String>,
    /// A CSV time series of `timestamp,g_per_kwh` (RFC 3339 or Unix seconds), matched to
    /// each window by time.
    #[arg(long, value_name = "FILE")]
    pub carbon_series: Option<PathBuf>,
    /// Live intensity from an API of the Electricity Maps shape at this base URL (https
    /// only), e.g. `https://api.electricitymaps.com`; needs --carbon-zone.
    #[arg(long, value_name = "URL")]
    pub carbon_api: Option<String>,
    /// File holding the API token (sent as `auth-token`; never give it on the command line).
    #[arg(long, value_name = "FILE", requires = "carbon_api")]
    pub carbon_token_file: Option<PathBuf>,
    /// PEM file of CA certificates to trust for --carbon-api instead of the system's.
    #[arg(long, value_name = "FILE", requires = "carbon_api")]
    pub carbon_ca: Option<PathBuf>,
    /// How often the live source is asked for its latest value, seconds.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 300.0,
        requires = "carbon_api"
    )]
    pub carbon_refresh: f64,
    /// Power usage effectiveness of the data centre (1.0-3.0): grams are multiplied by it.
    #[arg(long, value_name = "FACTOR", value_parser = parse_pue)]
    pub pue: Option<f64>,
}

fn parse_intensity(text: &str) -> Result<f64, String> {
    let g: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of gCO2e/kWh"))?;
    if !super::valid_intensity(g) {
        return Err(format!(
            "{g} gCO2e/kWh is not a plausible grid intensity (0-5000)"
        ));
    }
    Ok(g)
}

fn parse_pue(text: &str) -> Result<f64, String> {
    let p: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a PUE factor"))?;
    if !(1.0..=3.0).contains(&p) {
        return Err(format!("PUE must be between 1.0 and 3.0, got {p}"));
    }
    Ok(p)
}

impl CarbonArgs {
    /// Whether any carbon flag was given.
    pub fn any(&self) -> bool {
        self.carbon_intensity.is_some()
            || self.carbon_zone.is_some()
            || self.carbon_series.is_some()
            || self.carbon_api.is_some()
    }

    /// The source the flags name; `None` when they name none (no grams shown).
    pub fn carbon(&self) -> anyhow::Result<Option<Carbon>> {
        let pue = self.pue.unwrap_or(1.0);
        if !self.any() {
            anyhow::ensure!(
                self.pue.is_none(),
                "--pue multiplies grams: give an intensity too (--carbon-intensity, --carbon-zone, --carbon-series or --carbon-api)"
            );
            return Ok(None);
        }
        let source = if let Some(base) = &self.carbon_api {
            anyhow::ensure!(
                self.carbon_series.is_none(),
                "--carbon-series and --carbon-api are two sources: give one"
            );
            let zone = self.carbon_zone.clone().ok_or_else(|| {
                anyhow::anyhow!("--carbon-api needs --carbon-zone: the zone to ask for (e.g. FR)")
            })?;
            anyhow::ensure!(
                self.carbon_refresh.is_finite() && self.carbon_refresh >= 1.0,
                "--carbon-refresh must be at least 1 second"
            );
            Source::Live(Box::new(live::Live::new(
                live::Config {
                    base: base.clone(),
                    zone,
                    token_file: self.carbon_token_file.clone(),
                    ca: self.carbon_ca.clone(),
                    refresh: Duration::from_secs_f64(self.carbon_refresh),
                },
                self.carbon_intensity,
            )?))
        } else if let Some(path) = &self.carbon_series {
            anyhow::ensure!(
                self.carbon_intensity.is_none() && self.carbon_zone.is_none(),
                "--carbon-series gives the intensity: drop --carbon-intensity and --carbon-zone"
            );
            let s = Series::read(path)
                .map_err(|e| anyhow::anyhow!("--carbon-series {}: {e}", path.display()))?;
            Source::Series(s, path.clone())
        } else if let Some(g) = self.carbon_intensity {
            anyhow::ensure!(
                self.carbon_zone.is_none(),
                "--carbon-intensity and --carbon-zone both give the intensity: give one (or add --carbon-api to make the value the live source's fallback)"
            );
            Source::Fixed(g)
        } else {
            let zone = self.carbon_zone.as_deref().unwrap_or_default();
            Source::Zone(zones::lookup(zone)?)
        };
        Ok(Some(Carbon { source, pue }))
    }
}
