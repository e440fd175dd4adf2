//! Injected faults, settable from Rust or over `POST /sim/fault`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How an engine misbehaves. Inference routes obey every fault but [`Fault::HealthDown`],
/// which only the health routes obey, and [`Fault::LoadsHang`], which only the load routes
/// (`/v1/loads`, `/metrics`) obey.
///
/// On the wire (`POST /sim/fault`) a fault is tagged by `kind`:
/// `{"kind":"none"}`, `{"kind":"latency","ms":200}`,
/// `{"kind":"error_status","status":503,"body":"overloaded"}`, `{"kind":"hang"}`,
/// `{"kind":"crash_mid_stream","after_chunks":3}`, `{"kind":"malformed_body"}`,
/// `{"kind":"health_down"}`, `{"kind":"loads_hang"}`, `{"kind":"freeze"}`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(from = "FaultWire", into = "FaultWire")]
pub enum Fault {
    /// Behave.
    #[default]
    None,
    /// Wait this long before the first byte of the answer.
    Latency(Duration),
    /// Answer this status and body instead of serving the request.
    ErrorStatus { status: u16, body: String },
    /// Accept the request and never answer.
    Hang,
    /// Send this many chunks, then drop the connection with no `[DONE]`
    /// (non-streaming: the head and half the body, then drop).
    CrashMidStream { after_chunks: usize },
    /// Answer 200 with a body that is not JSON (broken `data:` lines when streaming).
    MalformedBody,
    /// `/health`, `/health_generate` and `/ready` answer 503.
    HealthDown,
    /// `/v1/loads` and `/metrics` accept the request and never answer.
    LoadsHang,
    /// Every route, health and load ones included, accepts the request and never
    /// answers: a frozen process (SIGSTOP, a wedged GPU driver).
    Freeze,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum FaultWire {
    None,
    Latency {
        ms: u64,
    },
    ErrorStatus {
        status: u16,
        #[serde(default)]
        body: String,
    },
    Hang,
    CrashMidStream {
        after_chunks: usize,
    },
    MalformedBody,
    HealthDown,
    LoadsHang,
    Freeze,
}

impl From<FaultWire> for Fault {
    fn from(w: FaultWire) -> Self {
        match w {
            FaultWire::None => Fault::None,
            FaultWire::Latency { ms } => Fault::Latency(Duration::from_millis(ms)),
            FaultWire::ErrorStatus { status, body } => Fault::ErrorStatus { status, body },
            FaultWire::Hang => Fault::Hang,
            FaultWire::CrashMidStream { after_chunks } => Fault::CrashMidStream { after_chunks },
            FaultWire::MalformedBody => Fault::MalformedBody,
            FaultWire::HealthDown => Fault::HealthDown,
            FaultWire::LoadsHang => Fault::LoadsHang,
            FaultWire::Freeze => Fault::Freeze,
        }
    }
}

impl From<Fault> for FaultWire {
    fn from(f: Fault) -> Self {
        match f {
            Fault::None => FaultWire::None,
            Fault::Latency(d) => FaultWire::Latency {
                ms: u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            },
            Fault::ErrorStatus { status, body } => FaultWire::ErrorStatus { status, body },
            Fault::Hang => FaultWire::Hang,
            Fault::CrashMidStream { after_chunks } => FaultWire::CrashMidStream { after_chunks },
            Fault::MalformedBody => FaultWire::MalformedBody,
            Fault::HealthDown => FaultWire::HealthDown,
            Fault::LoadsHang => FaultWire::LoadsHang,
            Fault::Freeze => FaultWire::Freeze,
        }
    }
}

#[cfg(test)]
#[test]
fn wire_form_round_trips() {
    let cases = [
        (r#"{"kind":"none"}"#, Fault::None),
        (
            r#"{"kind":"latency","ms":200}"#,
            Fault::Latency(Duration::from_millis(200)),
        ),
        (
            r#"{"kind":"error_status","status":503,"body":"busy"}"#,
            Fault::ErrorStatus {
                status: 503,
                body: "busy".into(),
            },
        ),
        (
            r#"{"kind":"crash_mid_stream","after_chunks":3}"#,
            Fault::CrashMidStream { after_chunks: 3 },
        ),
        (r#"{"kind":"health_down"}"#, Fault::HealthDown),
        (r#"{"kind":"loads_hang"}"#, Fault::LoadsHang),
    ];
    for (text, fault) in cases {
        let parsed: Fault = serde_json::from_str(text).unwrap();
        assert_eq!(parsed, fault);
        assert_eq!(serde_json::to_string(&fault).unwrap(), text);
    }
    assert!(serde_json::from_str::<Fault>(r#"{"kind":"latency","secs":1}"#).is_err());
}
