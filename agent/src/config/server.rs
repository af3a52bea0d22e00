//! `[server]`: the HTTP server of `/metrics`, the health checks and the local status API.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of `/metrics`, `/healthz`, `/readyz` and the local status API; empty disables it.
    #[serde(with = "listen")]
    #[educe(Default(expression = Some(std::net::SocketAddr::from(([0, 0, 0, 0], 9464)))))]
    pub(crate) listen: Option<std::net::SocketAddr>,
}

/// A listener's address (`server.listen`, `worker_api.listen`): a socket address, or the empty
/// string for none.
pub(super) mod listen {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        v: &Option<SocketAddr>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.map(|a| a.to_string()).unwrap_or_default())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        if text.trim().is_empty() {
            return Ok(None);
        }
        let why = format!("`{text}` is not host:port (e.g. 0.0.0.0:9464), or \"\" for no listener");
        text.trim().parse().map(Some).map_err(|_| serde::de::Error::custom(why))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_names_keys, parse};

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[("[server]\nlisten = \"nope\"", "server.listen")]);
    }

    #[test]
    fn empty_disables_the_server() {
        assert_eq!(parse("[server]\nlisten = \"\"\n").unwrap().server.listen, None);
    }
}
