//! The gateway's port with TLS (`--tls-cert-path`, `--tls-key-path`): answered over
//! https with the test CA of `tests/fixtures/tls`, the certificate reloaded when its
//! files change and on SIGHUP, without a restart.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::path::Path;

use kvgate_engine_sim::SimConfig;
use kvgate_tests::tls::{certs, fixture, https_client, served_certificate};
use kvgate_tests::{Harness, wait_for_async};

/// Writes `from`'s content over `to`, keeping `to`'s modification time when `keep_time`.
fn copy_over(from: &str, to: &Path, keep_time: bool) {
    let before = std::fs::metadata(to).and_then(|m| m.modified()).ok();
    std::fs::write(to, std::fs::read(fixture(from)).expect("a fixture")).expect("write");
    if keep_time && let Some(t) = before {
        let f = std::fs::File::options().write(true).open(to).expect("open");
        f.set_modified(t).expect("set the modification time");
    }
}

#[actix_rt::test]
async fn https_is_answered_and_a_new_certificate_is_served_after_a_reload() {
    let files = tempfile::tempdir().expect("temp dir");
    let (cert, key) = (files.path().join("tls.crt"), files.path().join("tls.key"));
    copy_over("cert.pem", &cert, false);
    copy_over("key.pem", &key, false);
    let h = Harness::start(1, SimConfig::default(), |c| {
        c.tls.tls_cert_path = Some(cert.clone());
        c.tls.tls_key_path = Some(key.clone());
    });
    assert!(
        h.gw.url().starts_with("https://127.0.0.1:"),
        "{}",
        h.gw.url()
    );
    let (ca, ca2) = (fixture("ca.pem"), fixture("ca2.pem"));
    let both = [ca.as_path(), ca2.as_path()];
    // An https request, verified with the CA, is answered; the proxy path too.
    let client = https_client(&[&ca]);
    let r = client
        .get(h.url("/liveness"))
        .send()
        .await
        .expect("an https answer");
    assert_eq!(r.status().as_u16(), 200);
    let mut r = client
        .post(h.url("/v1/completions"))
        .insert_header(("content-type", "application/json"))
        .send_body(r#"{"prompt":"hello","max_tokens":2}"#)
        .await
        .expect("an https answer");
    assert_eq!(r.status().as_u16(), 200);
    assert!(!r.body().await.expect("a body").is_empty());
    // A body of many TLS records, read at the socket by the intake, and a streamed answer.
    for body in [
        format!(
            r#"{{"prompt":"{}","max_tokens":2}}"#,
            "long ".repeat(12_000)
        ),
        r#"{"prompt":"hello","max_tokens":3,"stream":true}"#.to_owned(),
    ] {
        let mut r = client
            .post(h.url("/v1/completions"))
            .insert_header(("content-type", "application/json"))
            .send_body(body)
            .await
            .expect("an https answer");
        let status = r.status().as_u16();
        let answer = r.body().limit(1 << 20).await.expect("a body");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        assert!(!answer.is_empty());
    }
    let first = certs(&fixture("cert.pem")).remove(0);
    assert_eq!(served_certificate(h.gw.addr(), &both).await, first);

    // The files replaced (key first, then certificate): the second one is served.
    copy_over("key2.pem", &key, false);
    copy_over("cert2.pem", &cert, false);
    let second = certs(&fixture("cert2.pem")).remove(0);
    let addr = h.gw.addr();
    wait_for_async(20, "the second certificate served", || {
        let (second, both) = (second.clone(), both);
        async move { served_certificate(addr, &both).await == second }
    })
    .await;

    // Back to the first, the files' times kept: only SIGHUP can make it reload now.
    copy_over("key.pem", &key, true);
    copy_over("cert.pem", &cert, true);
    let pid = std::process::id().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    wait_for_async(20, "the first certificate served again", || {
        let (first, both) = (first.clone(), both);
        async move { served_certificate(addr, &both).await == first }
    })
    .await;
}

#[actix_rt::test]
async fn a_listener_certificate_that_does_not_load_fails_the_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = kvgate_tests::test_config(&dir);
    // A certificate with another certificate's key.
    cfg.tls.tls_cert_path = Some(fixture("cert.pem"));
    cfg.tls.tls_key_path = Some(fixture("key2.pem"));
    let e = kvgate_gateway::Gateway::start(cfg.clone())
        .map(|_| ())
        .expect_err("refused");
    assert!(e.to_string().contains("cert.pem"), "{e}");
    cfg.tls.tls_key_path = None;
    let e = cfg.validate().expect_err("refused").to_string();
    assert!(
        e.contains("--tls-cert-path") && e.contains("--tls-key-path"),
        "{e}"
    );
}
