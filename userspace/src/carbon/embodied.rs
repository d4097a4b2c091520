//! Embodied (manufacturing) emissions of servers, for the M of SCI: the checked-in table
//! `userspace/data/carbon/embodied.csv` (provenance in `userspace/data/carbon/README.md`),
//! from the Cloud Carbon Footprint coefficients: kgCO2e per cloud instance type's host,
//! and their base rack server (1000 kgCO2e over a 4-year life).

/// The table, `provider,instance_type,embodied_kg`.
const TABLE: &str = include_str!("../../data/carbon/embodied.csv");

/// The base rack server of the Cloud Carbon Footprint method, kgCO2e.
pub const BASE_SERVER_KG: f64 = 1000.0;
/// Its life, years.
pub const LIFE_YEARS: f64 = 4.0;
/// Hours in a year (365 days).
const HOURS_PER_YEAR: f64 = 8760.0;

/// A server's embodied emissions and the life they are spread over.
#[derive(Clone, Debug, PartialEq)]
pub struct Embodied {
    /// Total embodied emissions, gCO2e.
    pub total_g: f64,
    /// Expected life, hours.
    pub life_h: f64,
    /// Where the figure came from.
    pub source: String,
}

impl Embodied {
    /// gCO2e per hour of reserved time: total over life.
    pub fn g_per_hour(&self) -> f64 {
        self.total_g / self.life_h
    }
}

/// The base rack server, or an instance type's (`aws:m5.large`, `azure:D2s v3`,
/// `gcp:n2-standard-8`).
pub fn lookup(instance: Option<&str>) -> Result<Embodied, String> {
    let life_h = LIFE_YEARS * HOURS_PER_YEAR;
    let Some(instance) = instance else {
        return Ok(Embodied {
            total_g: BASE_SERVER_KG * 1000.0,
            life_h,
            source: "base rack server, 1000 kgCO2e over 4 years (Cloud Carbon Footprint)".into(),
        });
    };
    let (provider, kind) = instance
        .split_once(':')
        .ok_or_else(|| format!("`{instance}` is not PROVIDER:TYPE, e.g. aws:m5.large"))?;
    let provider = provider.to_ascii_lowercase();
    TABLE
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.splitn(3, ',');
            Some((f.next()?, f.next()?, f.next()?.parse::<f64>().ok()?))
        })
        .find(|(p, t, _)| *p == provider && t.eq_ignore_ascii_case(kind))
        .map(|(p, t, kg)| Embodied {
            total_g: kg * 1000.0,
            life_h,
            source: format!("{p}:{t} host, {kg} kgCO2e over 4 years (Cloud Carbon Footprint)"),
        })
        .ok_or_else(|| {
            format!(
                "no embodied figure for `{instance}` in the built-in table; give one with --embodied-g-per-hour"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_server_is_about_28_grams_an_hour() {
        let e = lookup(None).expect("base");
        assert!((e.g_per_hour() - 1e6 / 35_040.0).abs() < 1e-9);
    }

    #[test]
    fn instance_types_are_found_and_unknown_ones_say_so() {
        let e = lookup(Some("aws:m5.large")).expect("m5.large");
        assert!(e.total_g >= BASE_SERVER_KG * 1000.0);
        assert!(lookup(Some("aws:no-such")).is_err());
        assert!(lookup(Some("m5.large")).is_err());
    }
}
