//! How sensitive a request is, and every place that said so.
//!
//! A level can come from several places at once: each value of the
//! sensitivity header, each `metadata.sensitivity` in the body, detection,
//! a tenant's default. They are all kept in a [`SensitivitySet`] and the
//! most restrictive wins, so no later code can pick the convenient one.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Ordered from least to most restrictive: `max` is the safe combination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Sensitivity {
    #[default]
    Public,
    Internal,
    Restricted,
}

impl Sensitivity {
    pub const ALL: [Sensitivity; 3] = [
        Sensitivity::Public,
        Sensitivity::Internal,
        Sensitivity::Restricted,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Sensitivity::Public => "public",
            Sensitivity::Internal => "internal",
            Sensitivity::Restricted => "restricted",
        }
    }

    /// A label a client sent. Unlike the operator's config, a client's
    /// unknown label is not an error: it counts as the most sensitive, so a
    /// typo keeps data in rather than letting it out.
    pub fn from_client_label(label: &str) -> Sensitivity {
        label.parse().unwrap_or(Sensitivity::Restricted)
    }
}

impl fmt::Display for Sensitivity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sensitivity level '{0}' (expected public, internal or restricted)")]
pub struct UnknownSensitivity(pub String);

impl FromStr for Sensitivity {
    type Err = UnknownSensitivity;

    /// Strict: surrounding space and case are forgiven, nothing else.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        Sensitivity::ALL
            .into_iter()
            .find(|level| level.name().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| UnknownSensitivity(s.to_string()))
    }
}

/// In config files an unknown level is an error that names the bad value:
/// `never_leave = ["restriced"]` must not start a node that lets
/// restricted data leave.
impl<'de> Deserialize<'de> for Sensitivity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let label = String::deserialize(deserializer)?;
        label.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for Sensitivity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// Where a level came from; kept for the reason header and the audit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// One value of the sensitivity header (a request may carry several).
    Header,
    /// One `metadata.sensitivity` in the body.
    Body,
    /// A detector found this kind of data (`email`, `payment-card`, …).
    Detected(&'static str),
    /// The client's tenant defaults to this level.
    TenantDefault,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Header => f.write_str("header"),
            Source::Body => f.write_str("metadata"),
            Source::Detected(kind) => write!(f, "detected {kind}"),
            Source::TenantDefault => f.write_str("tenant default"),
        }
    }
}

/// Every level a request was given, from every source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SensitivitySet {
    levels: Vec<(Source, Sensitivity)>,
}

impl SensitivitySet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, source: Source, level: Sensitivity) {
        self.levels.push((source, level));
    }

    /// The most restrictive level given; public when nothing was.
    pub fn level(&self) -> Sensitivity {
        self.levels
            .iter()
            .map(|(_, level)| *level)
            .max()
            .unwrap_or_default()
    }

    pub fn sources(&self) -> &[(Source, Sensitivity)] {
        &self.levels
    }

    /// The kinds of data detectors found, in the order found.
    pub fn detected(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.levels.iter().filter_map(|(source, _)| match source {
            Source::Detected(kind) => Some(*kind),
            _ => None,
        })
    }

    /// Why the request has its level: the sources that set the winning
    /// level, e.g. `restricted (header, detected email)`.
    pub fn explain(&self) -> String {
        let level = self.level();
        let why: Vec<String> = self
            .levels
            .iter()
            .filter(|(_, l)| *l == level)
            .map(|(source, _)| source.to_string())
            .collect();
        if why.is_empty() {
            format!("{level} (nothing declared)")
        } else {
            format!("{level} ({})", why.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_restrictive_level_wins_whatever_the_order() {
        let mut set = SensitivitySet::new();
        set.add(Source::Header, Sensitivity::Restricted);
        set.add(Source::Header, Sensitivity::Public);
        set.add(Source::Body, Sensitivity::Internal);
        assert_eq!(set.level(), Sensitivity::Restricted);
        let mut reversed = SensitivitySet::new();
        reversed.add(Source::Body, Sensitivity::Internal);
        reversed.add(Source::Header, Sensitivity::Public);
        reversed.add(Source::Header, Sensitivity::Restricted);
        assert_eq!(reversed.level(), Sensitivity::Restricted);
        assert_eq!(set.explain(), "restricted (header)");
    }

    #[test]
    fn nothing_declared_is_public() {
        let set = SensitivitySet::new();
        assert_eq!(set.level(), Sensitivity::Public);
        assert_eq!(set.explain(), "public (nothing declared)");
    }

    #[test]
    fn client_labels_fail_closed_config_labels_fail_loudly() {
        assert_eq!(
            Sensitivity::from_client_label(" PUBLIC "),
            Sensitivity::Public
        );
        assert_eq!(
            Sensitivity::from_client_label("restriced"),
            Sensitivity::Restricted
        );
        assert_eq!(
            Sensitivity::from_client_label("publi"),
            Sensitivity::Restricted
        );
        let error = "restriced".parse::<Sensitivity>().unwrap_err();
        assert!(error.to_string().contains("'restriced'"), "{error}");
    }

    #[test]
    fn config_deserialisation_names_the_bad_level() {
        #[derive(Deserialize, Debug)]
        struct Guard {
            #[allow(dead_code)]
            never_leave: Vec<Sensitivity>,
        }
        let error = toml::from_str::<Guard>(r#"never_leave = ["internal", "restriced"]"#)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("unknown sensitivity level 'restriced'"),
            "{error}"
        );
        let ok: Guard = toml::from_str(r#"never_leave = ["Restricted"]"#).unwrap();
        assert_eq!(ok.never_leave, vec![Sensitivity::Restricted]);
    }

    #[test]
    fn detected_kinds_are_listed() {
        let mut set = SensitivitySet::new();
        set.add(Source::Detected("email"), Sensitivity::Restricted);
        set.add(Source::Header, Sensitivity::Public);
        set.add(Source::Detected("iban"), Sensitivity::Restricted);
        assert_eq!(set.detected().collect::<Vec<_>>(), vec!["email", "iban"]);
        assert_eq!(set.explain(), "restricted (detected email, detected iban)");
    }
}
