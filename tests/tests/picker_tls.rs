//! The picker's ext_proc port over TLS (`--ext-proc-tls-cert`, `--ext-proc-tls-key`), with
//! the test-only certificate of `tests/fixtures/tls`: a client that trusts its CA gets
//! picks, the separate health port stays cleartext (the kubelet's gRPC probes speak no
//! TLS), and a key that is no key fails the start.

use std::path::PathBuf;

use kvgate_engine_sim::SimConfig;
use kvgate_gateway::{Gateway, StartError};
use kvgate_tests::envoy::Envoy;
use kvgate_tests::{Harness, test_config};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/tls")
        .join(name)
}

#[actix_rt::test]
async fn picks_come_over_tls_and_health_stays_cleartext() {
    let h = Harness::start(2, SimConfig::default(), |c| {
        c.picker.ext_proc_port = Some(0);
        c.picker.grpc_health_port = Some(0);
        c.picker.ext_proc_tls_cert = Some(fixture("cert.pem"));
        c.picker.ext_proc_tls_key = Some(fixture("key.pem"));
    });
    let addr = h.gw.ext_proc_addr().expect("the picker listens");
    let ca = std::fs::read(fixture("ca.pem")).expect("the CA");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .expect("an endpoint")
        .tls_config(tls)
        .expect("TLS settings")
        .connect()
        .await
        .expect("a TLS connection");
    let e = Envoy::over(channel);
    let body = br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#;
    let (mut ex, answer) = e.route("/v1/chat/completions", body, 2, None).await;
    let picked = answer.endpoints()[0].clone();
    ex.respond(200, Some(&picked), b"{}", 1).await;
    // Cleartext to the TLS port gets nothing.
    let plain = Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect()
        .await;
    if let Ok(ch) = plain {
        let mut c = HealthClient::new(ch);
        let r = c.check(HealthCheckRequest::default()).await;
        assert!(r.is_err(), "cleartext answered on the TLS port: {r:?}");
    }
    let health = h.gw.grpc_health_addr().expect("the health port");
    let ch = Endpoint::from_shared(format!("http://{health}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("cleartext health");
    let r = HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: "readiness".into(),
        })
        .await
        .expect("a health answer")
        .into_inner();
    assert_eq!(r.status, ServingStatus::Serving as i32);
    h.gw.stop();
}

#[test]
fn a_key_that_is_no_key_fails_the_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.picker.ext_proc_port = Some(0);
    cfg.picker.ext_proc_tls_cert = Some(fixture("cert.pem"));
    cfg.picker.ext_proc_tls_key = Some(fixture("ca.pem"));
    match Gateway::start(cfg) {
        Err(StartError::PickerTls { path, .. }) => assert!(path.ends_with("cert.pem"), "{path}"),
        Err(e) => panic!("another error: {e}"),
        Ok(gw) => {
            gw.stop();
            panic!("started with a certificate as its key");
        }
    }
}
