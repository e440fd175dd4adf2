//! Engines behind TLS (`https://` worker URLs): a TLS relay with the test-only private CA
//! of `tests/fixtures/tls` in front of a simulated engine or a scripted upstream. With
//! `--worker-ca-cert` the worker is checked, polled and proxied byte for byte; without it
//! the certificate is refused and said so; an engine that asks for a client certificate
//! gets `--worker-client-cert`'s.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_gateway::{Gateway, GatewayConfig};
use kvgate_policies::{PolicyConfig, PolicyKind};
use kvgate_tests::raw::{RawUpstream, Script};
use kvgate_tests::tls::{TlsRelay, addr_of, fixture, server_config};
use kvgate_tests::{Harness, post, test_config, until_workers};
use std::sync::atomic::Ordering;

/// A relay with the fixtures' `localhost` certificate in front of `plain_url`; with
/// `client_ca`, it asks for a client certificate signed by it.
fn relay(plain_url: &str, client_ca: Option<&str>) -> TlsRelay {
    let ca = client_ca.map(fixture);
    let config = server_config(&fixture("cert.pem"), &fixture("key.pem"), ca.as_deref());
    TlsRelay::start(addr_of(plain_url), config)
}

/// A gateway routing to `url` alone, with `tweak` applied.
fn gateway(url: &str, tweak: impl FnOnce(&mut GatewayConfig)) -> (Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![url.to_owned()];
    tweak(&mut cfg);
    (Gateway::start(cfg).expect("gateway starts"), dir)
}

fn trusting_the_ca(c: &mut GatewayConfig) {
    c.tls.worker_ca_cert = Some(fixture("ca.pem"));
}

const CHAT: &str =
    r#"{"messages":[{"role":"user","content":"caf\u00e9 au lait"}],  "max_tokens" : 4}"#;
const STREAM: &str =
    r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":3}"#;

#[actix_rt::test]
async fn an_https_engine_behind_a_private_ca_is_checked_polled_and_proxied() {
    let fleet = SimFleet::start(1, SimConfig::default()).expect("a simulated engine");
    let tls = relay(&fleet.urls()[0], None);
    let (gw, _dir) = gateway(&tls.url(), trusting_the_ca);
    let w = until_workers(&gw, "the https worker healthy", |w| {
        w.first().is_some_and(|w| w["healthy"] == true)
    })
    .await;
    assert_eq!(w[0]["url"], tls.url(), "the scheme is kept: {w:?}");
    // Load polls go over TLS too: the selector gets a report.
    let h = Harness {
        fleet,
        gw,
        dir: tempfile::tempdir().expect("temp dir"),
    };
    h.wait_for_load_reports().await;
    let r = post(&h.url("/v1/chat/completions"), CHAT).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert!(
        r.json()["choices"][0]["message"]["content"].is_string(),
        "{}",
        r.text()
    );
    let r = post(&h.url("/v1/chat/completions"), STREAM).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let (events, done) = kvgate_tests::sse_events(&r.text());
    assert!(done && !events.is_empty(), "{}", r.text());
    assert_eq!(h.fleet.engine(0).stats().requests, 2);
    assert_eq!(tls.refused.load(Ordering::SeqCst), 0);
    // Kept alive: the requests did not each open a TLS connection of their own.
    assert!(tls.relayed.load(Ordering::SeqCst) >= 1);
}

#[actix_rt::test]
async fn requests_and_answers_cross_tls_byte_for_byte() {
    // Larger than TLS records (16 KiB) and rustls's buffers: many records each way.
    let long = format!(
        r#"{{"messages":[{{"role":"user","content":"{}"}}],"max_tokens":1}}"#,
        "long prompt text ".repeat(40_000)
    );
    let long_answer = format!(r#"{{"id":"y","text":"{}"}}"#, "caf\u{e9} ".repeat(60_000));
    for (content_type, chunks, body) in [
        (
            "application/json",
            vec![long_answer.as_bytes().to_vec()],
            long.as_str(),
        ),
        (
            "application/json",
            vec![
                br#"{"id":"x","choices":[{"message":{"content":"caf"#.to_vec(),
                "\u{e9}\"}}]}".as_bytes().to_vec(),
            ],
            CHAT,
        ),
        (
            "text/event-stream",
            vec![
                b"data: {\"a\":1}\n\n".to_vec(),
                b"data: {\"text\":\"caf".to_vec(),
                vec![0xC3],
                vec![0xA9, b'"', b'}', b'\n', b'\n'],
                b"data: [DONE]\n\n".to_vec(),
            ],
            STREAM,
        ),
    ] {
        let up = RawUpstream::start(Script {
            status: 200,
            content_type,
            chunks: chunks.clone(),
            crash: false,
        });
        let tls = relay(&up.url, None);
        // Round robin: the answer is what is tested, and a cache-aware gateway would keep
        // the long prompt in its snapshot.
        let (gw, _dir) = gateway(&tls.url(), |c| {
            trusting_the_ca(c);
            c.policy = PolicyConfig::with_kind(PolicyKind::RoundRobin);
        });
        until_workers(&gw, "the https worker healthy", |w| {
            w.first().is_some_and(|w| w["healthy"] == true)
        })
        .await;
        let r = post(
            &format!("{}/v1/chat/completions", gw.url()),
            body.to_owned(),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        assert_eq!(
            r.body,
            chunks.concat(),
            "{content_type}: the answer as sent"
        );
        let seen = up.seen.lock().expect("lock").clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].1, body.as_bytes(), "the request body as sent");
        assert!(
            seen[0]
                .0
                .contains(&format!("host: localhost:{}", tls.addr.port())),
            "{}",
            seen[0].0
        );
    }
}

#[actix_rt::test]
async fn without_the_ca_the_engine_is_refused_for_its_certificate() {
    let fleet = SimFleet::start(1, SimConfig::default()).expect("a simulated engine");
    let tls = relay(&fleet.urls()[0], None);
    // The system's roots (if any) do not hold the test CA.
    let (gw, _dir) = gateway(&tls.url(), |_| {});
    let w = until_workers(&gw, "a reason for the https worker", |w| {
        w.first().is_some_and(|w| w["last_error"].is_string())
    })
    .await;
    assert_eq!(w[0]["healthy"], false, "{w:?}");
    let reason = w[0]["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        reason.contains("certificate") || reason.contains("unknownissuer"),
        "{reason}"
    );
    let r = post(&format!("{}/v1/chat/completions", gw.url()), CHAT).await;
    r.assert_error(503, "no_available_workers");
    let port = tls.addr.port().to_string();
    assert!(
        !r.text().contains(&port) && !r.text().contains("127.0.0.1"),
        "{}",
        r.text()
    );
    assert_eq!(fleet.engine(0).stats().requests, 0);
    assert!(tls.refused.load(Ordering::SeqCst) >= 1);
}

#[actix_rt::test]
async fn an_engine_that_asks_for_a_client_certificate_gets_the_configured_one() {
    let fleet = SimFleet::start(1, SimConfig::default()).expect("a simulated engine");
    let tls = relay(&fleet.urls()[0], Some("ca2.pem"));
    // Without a client certificate: refused.
    let (gw, _dir) = gateway(&tls.url(), trusting_the_ca);
    let w = until_workers(&gw, "a reason for the mTLS worker", |w| {
        w.first().is_some_and(|w| w["last_error"].is_string())
    })
    .await;
    assert_eq!(w[0]["healthy"], false, "{w:?}");
    post(&format!("{}/v1/chat/completions", gw.url()), CHAT)
        .await
        .assert_error(503, "no_available_workers");
    drop(gw);
    // With one signed by the CA the relay asks for: served.
    let (gw, _dir) = gateway(&tls.url(), |c| {
        trusting_the_ca(c);
        c.tls.worker_client_cert = Some(fixture("client.pem"));
        c.tls.worker_client_key = Some(fixture("client-key.pem"));
    });
    until_workers(&gw, "the mTLS worker healthy", |w| {
        w.first().is_some_and(|w| w["healthy"] == true)
    })
    .await;
    let r = post(&format!("{}/v1/chat/completions", gw.url()), CHAT).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(fleet.engine(0).stats().requests, 1);
}

#[actix_rt::test]
async fn a_client_certificate_without_its_key_is_a_config_error_naming_both_flags() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (cert, key) in [(Some("client.pem"), None), (None, Some("client-key.pem"))] {
        let mut cfg = test_config(&dir);
        cfg.tls.worker_client_cert = cert.map(fixture);
        cfg.tls.worker_client_key = key.map(fixture);
        let e = cfg.validate().expect_err("refused").to_string();
        assert!(
            e.contains("--worker-client-cert") && e.contains("--worker-client-key"),
            "{e}"
        );
    }
    // A CA file that holds no certificate fails the start, naming the file.
    let mut cfg = test_config(&dir);
    cfg.tls.worker_ca_cert = Some(fixture("README.md"));
    let e = Gateway::start(cfg)
        .map(|_| ())
        .expect_err("refused")
        .to_string();
    assert!(e.contains("README.md"), "{e}");
}
