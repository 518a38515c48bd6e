//! Where a request runs. One type, one text form (`local:NAME`,
//! `cloud:NAME`, `peer:NAME`) written and read in this file only.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TargetKind {
    /// A model this node runs itself.
    Local,
    /// An upstream outside the node, reached through cloud-fetch.
    Cloud,
    /// Another edgeroute node of the fleet.
    Peer,
}

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Local => "local",
            TargetKind::Cloud => "cloud",
            TargetKind::Peer => "peer",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    Local(String),
    Cloud(String),
    Peer(String),
}

impl Target {
    pub fn kind(&self) -> TargetKind {
        match self {
            Target::Local(_) => TargetKind::Local,
            Target::Cloud(_) => TargetKind::Cloud,
            Target::Peer(_) => TargetKind::Peer,
        }
    }

    /// The model, upstream or peer name.
    pub fn name(&self) -> &str {
        match self {
            Target::Local(name) | Target::Cloud(name) | Target::Peer(name) => name,
        }
    }

    /// Whether the request's data leaves this node to run there.
    pub fn leaves_node(&self) -> bool {
        !matches!(self, Target::Local(_))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind().name(), self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a target (expected local:NAME, cloud:NAME or peer:NAME)")]
pub struct UnknownTarget(pub String);

impl FromStr for Target {
    type Err = UnknownTarget;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || UnknownTarget(s.to_string());
        let (kind, name) = s.split_once(':').ok_or_else(bad)?;
        if name.is_empty() {
            return Err(bad());
        }
        let name = name.to_string();
        match kind {
            "local" => Ok(Target::Local(name)),
            "cloud" => Ok(Target::Cloud(name)),
            "peer" => Ok(Target::Peer(name)),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips() {
        for target in [
            Target::Local("smollm2".into()),
            Target::Cloud("frontier".into()),
            Target::Peer("edge-2".into()),
        ] {
            assert_eq!(target.to_string().parse::<Target>(), Ok(target.clone()));
        }
        assert_eq!(Target::Cloud("a:b".into()).to_string(), "cloud:a:b");
        assert_eq!("cloud:a:b".parse(), Ok(Target::Cloud("a:b".into())));
    }

    #[test]
    fn malformed_targets_are_errors() {
        for bad in ["none", "local:", "remote:x", "", ":x"] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
    }

    #[test]
    fn only_local_keeps_data_on_the_node() {
        assert!(!Target::Local("m".into()).leaves_node());
        assert!(Target::Cloud("u".into()).leaves_node());
        assert!(Target::Peer("p".into()).leaves_node());
    }
}
