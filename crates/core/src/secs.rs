//! The config files' form of a duration: a number of seconds, fractions allowed (`*_secs`
//! keys). One definition for every kvgate crate's configuration, used as
//! `#[serde(with = "kvgate_core::secs")]`.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Refuses negative, non-finite and out-of-range values.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let v = f64::deserialize(d)?;
    Duration::try_from_secs_f64(v).map_err(serde::de::Error::custom)
}

/// `Option<Duration>` as seconds, where 0 (the reference gateway's spelling) means `None`.
pub mod or_off {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.map_or(0.0, |d| d.as_secs_f64()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let d = super::deserialize(d)?;
        Ok((!d.is_zero()).then_some(d))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::Deserialize;

    #[derive(Deserialize)]
    struct T {
        #[serde(with = "super")]
        d: Duration,
        #[serde(with = "super::or_off")]
        off: Option<Duration>,
    }

    #[test]
    fn seconds_with_fractions_and_zero_as_off() {
        let t: T = serde_json::from_str(r#"{"d": 1.5, "off": 0}"#).expect("parses");
        assert_eq!((t.d, t.off), (Duration::from_millis(1500), None));
        let t: T = serde_json::from_str(r#"{"d": 0, "off": 2}"#).expect("parses");
        assert_eq!((t.d, t.off), (Duration::ZERO, Some(Duration::from_secs(2))));
        assert!(serde_json::from_str::<T>(r#"{"d": -1, "off": 0}"#).is_err());
    }
}
