//! `Duration` as whole milliseconds on the wire, for
//! `#[serde(with = "tower_llm_core::layer::serde_millis")]` on the fields
//! of a layer's (or a provider's) serde config, and on this crate's
//! records and answers (`elapsed`, `latency`).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Writes whole milliseconds (saturating).
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Reads whole milliseconds.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_millis)
}
