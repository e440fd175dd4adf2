//! The fleet page in a real browser: headless Chromium loads `/dashboard` from a gateway in
//! front of simulated engines, every worker has its row, and the numbers move after
//! traffic. A screenshot is kept in the target dir. Without Chromium the test says so and
//! passes, unless `CI_BROWSER_TEST` is set (as `.ci/run` sets it): there it fails.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

use kvgate_engine_sim::SimConfig;
use kvgate_tests::{Harness, post_json};
use serde_json::json;

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| {
            std::env::var_os("PATH")
                .into_iter()
                .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .map(move |d| d.join(name))
        })
        .find(|p| p.is_file())
}

/// Chromium's flags for a headless run as root in a container; the virtual time budget
/// lets the page's polls run before the DOM is taken.
fn headless(bin: &Path, profile: &Path) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--virtual-time-budget=5000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

fn dom(bin: &Path, profile: &Path, url: &str) -> String {
    let out = headless(bin, profile)
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of `attr="..."` on the first element that has it.
fn attr<'a>(html: &'a str, attr: &str) -> Option<&'a str> {
    let at = html.find(&format!("{attr}=\""))? + attr.len() + 2;
    html[at..].split('"').next()
}

#[actix_rt::test]
async fn the_fleet_page_shows_every_worker_and_moves_with_traffic() {
    let Some(bin) = chromium() else {
        assert!(
            std::env::var_os("CI_BROWSER_TEST").is_none(),
            "CI_BROWSER_TEST is set but no Chromium is installed"
        );
        eprintln!("skipped: no chromium on PATH (apt-get install chromium)");
        return;
    };
    let h = Harness::start(
        3,
        SimConfig {
            enable_cache_report: true,
            ..SimConfig::default()
        },
        |c| c.seed = Some(4),
    );
    h.wait_for_load_reports().await;
    let profile = tempfile::tempdir().expect("profile dir");
    let page = h.url("/dashboard");

    let before = dom(&bin, profile.path(), &page);
    for url in h.fleet.urls() {
        assert!(
            before.contains(&format!("data-worker=\"{url}\"")),
            "{url}: {before}"
        );
    }
    assert_eq!(attr(&before, "data-requests"), Some("0"), "{before}");
    // The chart reads the gateway's own history, sampled since it started.
    assert!(
        attr(&before, "data-samples").is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n >= 1)),
        "{before}"
    );
    assert!(before.contains("status-ready"), "{before}");

    let system = "You are the fleet page's assistant. ".repeat(20);
    for q in ["one", "two", "three", "four"] {
        let body = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}], "max_tokens": 2});
        let r = post_json(&h.url("/v1/chat/completions"), &body).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let after = dom(&bin, profile.path(), &page);
    assert_eq!(attr(&after, "data-requests"), Some("4"), "{after}");
    assert!(after.contains("data-path=\"miss\""), "{after}");
    assert!(after.contains("data-path=\"hit\""), "{after}");
    // The holder's index share is no longer 0 %: one worker's share cell reads 100 %.
    assert_eq!(
        after
            .matches("data-field=\"index_share\"><div class=\"kv\"><div class=\"bar\"><span style=\"width:100.0%\">")
            .count(),
        1,
        "{after}"
    );

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let out = headless(&bin, profile.path())
        .arg("--window-size=1280,720")
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&page)
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    eprintln!("screenshot: {}", shot.display());
}
