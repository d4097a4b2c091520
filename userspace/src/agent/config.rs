//! The agent's config file: TOML whose keys are the long flag names (`interval = 5`,
//! `metrics-addr = "127.0.0.1:9102"`, `energy-source = "model"`), turned into flags that
//! the command line parses before its own, so no second list of options can drift from
//! the first and flags given on the command line win.

use std::path::{Path, PathBuf};

/// Why a config file gives no flags.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The text is not TOML.
    #[error("not valid TOML")]
    Toml(#[source] toml::de::Error),
    /// The file names the config file itself.
    #[error("`config` cannot be set in a config file")]
    Recursive,
    /// A key's value is a table or a date, which no flag takes.
    #[error("`{key}`: expected a string, number, boolean or array, found {found}")]
    Value {
        /// The key.
        key: String,
        /// The TOML type found.
        found: &'static str,
    },
    /// A key or value of the file is wrong (the error names which).
    #[error("in {}", path.display())]
    In {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<ConfigError>,
    },
}

/// The flags the config file at `path` sets, in the file's key order.
pub fn read_flags(path: &Path) -> Result<Vec<String>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml_to_flags(&text).map_err(|e| ConfigError::In {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

/// TOML `key = value` lines as `--key=value` flags: strings, numbers, `true` (a bare flag)
/// and arrays (the flag repeated).
pub fn toml_to_flags(text: &str) -> Result<Vec<String>, ConfigError> {
    let table: toml::Table = text.parse().map_err(ConfigError::Toml)?;
    let mut flags = Vec::new();
    for (key, value) in &table {
        if key == "config" {
            return Err(ConfigError::Recursive);
        }
        let values = match value {
            toml::Value::Array(items) => items.iter().collect(),
            other => vec![other],
        };
        for v in values {
            match v {
                toml::Value::String(s) => flags.push(format!("--{key}={s}")),
                toml::Value::Integer(n) => flags.push(format!("--{key}={n}")),
                toml::Value::Float(x) => flags.push(format!("--{key}={x}")),
                toml::Value::Boolean(true) => flags.push(format!("--{key}")),
                toml::Value::Boolean(false) => {}
                other => {
                    return Err(ConfigError::Value {
                        key: key.clone(),
                        found: other.type_str(),
                    });
                }
            }
        }
    }
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn toml_keys_are_long_flags() {
        let flags = toml_to_flags(
            "interval = 2\nmetrics-addr = \":0\"\nmodel-idle-w = 3.5\nenergy-source = \"model\"\n",
        )
        .expect("parses");
        assert_eq!(
            flags,
            strings(&[
                "--energy-source=model",
                "--interval=2",
                "--metrics-addr=:0",
                "--model-idle-w=3.5"
            ])
        );
        assert!(matches!(
            toml_to_flags("config = \"x\""),
            Err(ConfigError::Recursive)
        ));
        assert!(matches!(
            toml_to_flags("interval = {a = 1}"),
            Err(ConfigError::Value { .. })
        ));
        assert!(matches!(
            toml_to_flags("interval = "),
            Err(ConfigError::Toml(_))
        ));
    }

    #[test]
    fn a_missing_file_is_named() {
        let err = read_flags(Path::new("/nonexistent/agent.toml")).expect_err("missing");
        assert!(err.to_string().contains("/nonexistent/agent.toml"), "{err}");
    }
}
