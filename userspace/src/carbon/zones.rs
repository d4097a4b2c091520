//! Yearly-average grid intensities per zone, from the checked-in table
//! `userspace/data/carbon/zones.csv` (provenance in `userspace/data/carbon/README.md`):
//! Electricity Maps yearly averages per country or grid zone (`FR`, `DE`, `US-CAL-CISO`)
//! and the cloud regions of the Cloud Carbon Footprint coefficients (`aws:eu-west-3`,
//! `gcp:europe-west1`, `azure:westeurope`).

/// The table, `zone,g_per_kwh,year,source,name`.
const TABLE: &str = include_str!("../../data/carbon/zones.csv");

/// One zone's yearly average.
#[derive(Clone, Debug, PartialEq)]
pub struct Zone {
    /// Its key (`FR`, `aws:eu-west-3`).
    pub zone: String,
    /// Yearly average intensity, gCO2e/kWh.
    pub g_per_kwh: f64,
    /// The year (or data release) it averages.
    pub year: String,
    /// Who published it.
    pub publisher: String,
    /// Country or place, for people.
    pub name: String,
}

impl Zone {
    /// `yearly average FR 2024 (Electricity Maps)`.
    pub fn label(&self) -> String {
        format!(
            "yearly average {} {} ({})",
            self.zone, self.year, self.publisher
        )
    }
}

/// Why a zone is not known.
#[derive(Debug, thiserror::Error)]
#[error(
    "no yearly average for zone `{0}` in the built-in table; use a country or grid zone (`FR`, `DE`, `US-CAL-CISO`), a cloud region (`aws:eu-west-3`, `gcp:europe-west1`, `azure:westeurope`), or give the value with --carbon-intensity"
)]
pub struct UnknownZone(pub String);

/// Normalises a key: zones as Electricity Maps spells them (`FR`, `US-CAL-CISO`), cloud
/// regions lower case without spaces (`azure:West Europe` → `azure:westeurope`).
fn key(zone: &str) -> String {
    match zone.split_once(':') {
        Some((cloud, region)) => format!(
            "{}:{}",
            cloud.trim().to_ascii_lowercase(),
            region.trim().to_ascii_lowercase().replace(' ', "")
        ),
        None => zone.trim().to_ascii_uppercase(),
    }
}

/// The yearly average of `zone`.
pub fn lookup(zone: &str) -> Result<Zone, UnknownZone> {
    let want = key(zone);
    all()
        .find(|z| z.zone == want)
        .ok_or_else(|| UnknownZone(zone.to_string()))
}

/// Every zone of the table.
pub fn all() -> impl Iterator<Item = Zone> {
    TABLE.lines().skip(1).filter_map(|line| {
        let mut f = line.splitn(5, ',');
        let zone = f.next()?.to_string();
        let g_per_kwh = f.next()?.parse().ok()?;
        Some(Zone {
            zone,
            g_per_kwh,
            year: f.next()?.to_string(),
            publisher: f.next()?.to_string(),
            name: f.next().unwrap_or("").to_string(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_the_table_reads_and_is_plausible() {
        let rows = TABLE.lines().skip(1).filter(|l| !l.is_empty()).count();
        let zones: Vec<Zone> = all().collect();
        assert_eq!(zones.len(), rows, "a row failed to parse");
        assert!(
            zones
                .iter()
                .all(|z| super::super::valid_intensity(z.g_per_kwh)),
            "implausible intensity"
        );
    }

    #[test]
    fn countries_and_cloud_regions_are_found() {
        let fr = lookup("fr").expect("FR");
        assert_eq!(fr.zone, "FR");
        assert!(
            fr.label().starts_with("yearly average FR 2024"),
            "{}",
            fr.label()
        );
        let aws = lookup("aws:eu-west-3").expect("aws:eu-west-3");
        assert!(aws.g_per_kwh > 0.0);
        assert!(lookup("azure:West Europe").is_ok());
        assert!(lookup("XX-NOWHERE").is_err());
    }
}
