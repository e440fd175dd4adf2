//! The binary's flags, environment and config file, as a user runs them.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::io::Write;
use std::process::Command;

fn kvgate(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvgate"));
    c.args(args).env_remove("RUST_LOG");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Runs a config that must be refused, returning what it printed. A kvgate that starts
/// instead is killed (bounded wait) and the test fails.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = kvgate(args, env);
    // Port 0 through the environment, so a case can still set the port itself.
    if !env.iter().any(|(k, _)| *k == "KVGATE_PORT") {
        cmd.env("KVGATE_PORT", "0");
    }
    let mut child = cmd
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kvgate runs");
    for _ in 0..1000 {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(!status.success(), "{args:?} must be refused");
            let mut err = String::new();
            let mut stderr = child.stderr.take().expect("piped stderr");
            std::io::Read::read_to_string(&mut stderr, &mut err).expect("stderr is text");
            return err;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{args:?} was accepted: kvgate started");
}

#[test]
fn bad_values_are_refused_naming_the_key() {
    assert!(refused(&["--cache-threshold", "1.5"], &[]).contains("cache_threshold"));
    assert!(refused(&["--policy", "fastest"], &[]).contains("fastest"));
    assert!(refused(&["--worker-urls", "ftp://x"], &[]).contains("worker_urls"));
    assert!(refused(&["--balance-rel-threshold", "0.5"], &[]).contains("balance_rel_threshold"));
    // A value outside a list names the flag and lists the values.
    let index = refused(&["--cache-index", "btree"], &[]);
    assert!(
        index.contains("--cache-index") && index.contains("tree") && index.contains("hash"),
        "{index}"
    );
    // Several values after one flag: the second is checked too.
    let proxies = refused(&["--trusted-proxies", "10.0.0.0/8", "proxy.example"], &[]);
    assert!(
        proxies.contains("trusted_proxies") && proxies.contains("proxy.example"),
        "{proxies}"
    );
    assert!(refused(&["--affinity-margin", "NaN"], &[]).contains("affinity_margin"));
    assert!(refused(&[], &[("KVGATE_PORT", "not-a-port")]).contains("port"));
    assert!(refused(&[], &[("KVGATE_POLICY__KIND", "nope")]).contains("nope"));
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(b"[policy]\nmax_tree_sise = 5\n").unwrap();
    assert!(refused(&["--config", f.path().to_str().unwrap()], &[]).contains("max_tree_sise"));
}

#[test]
fn flags_override_env_which_overrides_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    write!(
        f,
        "port = 1\nhost = \"127.0.0.1\"\n[policy]\nkind = \"random\"\n"
    )
    .unwrap();
    let mut child = kvgate(
        &[
            "--config",
            f.path().to_str().unwrap(),
            "--port",
            "0",
            "--policy",
            "least_load",
            // Cost-mode knobs have flags too.
            "--min-match-tokens",
            "32",
            "--affinity-margin",
            "0.25",
            "--data-dir",
            dir.path().to_str().unwrap(),
        ],
        &[
            ("KVGATE_PORT", "2"),
            ("KVGATE_POLICY__KIND", "power_of_two"),
            ("KVGATE_LOG_LEVEL", "info"),
        ],
    )
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .map_while(Result::ok)
        .find(|l| l.contains("kvgate listening"))
        .expect("it starts");
    let _ = child.kill();
    let _ = child.wait();
    // The flag wins over both (port 0 binds an OS-chosen port, not 1 or 2).
    assert!(line.contains("policy=least_load"), "{line}");
    assert!(
        !line.contains("127.0.0.1:1 ") && !line.contains("127.0.0.1:2 "),
        "{line}"
    );
}

#[test]
fn help_names_every_flags_default_key_and_variable() {
    let out = kvgate(&["--help"], &[]).output().expect("kvgate runs");
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).expect("text");
    let mut flags = 0;
    let lines: Vec<&str> = help.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(flag) = line.trim_start().strip_prefix("--") else {
            continue;
        };
        let name = flag.split([' ', '<']).next().unwrap_or("");
        if ["help", "version", "config", "print-example-config"].contains(&name) {
            continue;
        }
        let text = lines.get(i + 1).copied().unwrap_or("");
        // Taken from the reference gateway's scripts and without effect: no key to name.
        if text.contains("Accepted for the reference gateway's scripts") {
            assert!(!text.contains("[key: "), "--{name}: {text}");
            continue;
        }
        flags += 1;
        let var = format!("KVGATE_{}", name.replace('-', "_").to_ascii_uppercase());
        assert!(text.contains("[default: "), "--{name}: {text}");
        assert!(text.contains("[key: "), "--{name}: {text}");
        // The variable follows the key, which is the flag's own name except for knobs
        // under [policy] or [poller] and the reference's names.
        assert!(text.contains("[env: KVGATE_"), "--{name}: {text}");
        // The reference's spellings (`--retry-initial-backoff-ms`) set a key of kvgate's own.
        let alias = text.contains("The reference gateway's spelling of");
        if !alias && !text.contains("[key: policy.") && !text.contains("[key: poller.") {
            assert!(text.contains(&var), "--{name}: {text}");
        }
    }
    assert!(flags >= 40, "{flags} flags in\n{help}");
}
