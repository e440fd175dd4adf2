use kvgate_core::WorkerUrl;

use super::*;

fn list(entries: &[&str]) -> AllowList {
    let parsed = entries.iter().map(|e| Allowed::parse(e).expect("parses"));
    AllowList::new(parsed.collect())
}

fn url(s: &str) -> WorkerUrl {
    WorkerUrl::parse(s).expect("url")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

#[actix_rt::test]
async fn the_allow_list_takes_names_addresses_and_ranges() {
    let l = list(&["10.1.0.0/16", "gpu-7.example", "fd00::/8", "192.168.5.5"]);
    assert!(l.allows(&url("http://10.1.2.3:8000")).await);
    assert!(!l.allows(&url("http://10.2.0.1:8000")).await);
    assert!(l.allows(&url("http://GPU-7.example:1")).await);
    assert!(l.allows(&url("http://[fd12::1]:1")).await);
    assert!(l.allows(&url("http://192.168.5.5:1")).await);
    assert!(!l.allows(&url("http://192.168.5.6:1")).await);
    // localhost resolves to loopback, which no entry covers.
    assert!(!l.allows(&url("http://localhost:1")).await);
    assert!(
        list(&["127.0.0.0/8", "::1/128"])
            .allows(&url("http://localhost:1"))
            .await
    );
    assert!(AllowList::default().allows(&url("http://anything:1")).await);
}

#[test]
fn link_local_and_metadata_addresses_are_reserved() {
    for (addr, want) in [
        ("169.254.169.254", Some(Refusal::Metadata)),
        ("::ffff:169.254.169.254", Some(Refusal::Metadata)),
        ("fd00:ec2::254", Some(Refusal::Metadata)),
        ("100.100.100.200", Some(Refusal::Metadata)),
        ("168.63.129.16", Some(Refusal::Metadata)),
        ("169.254.170.2", Some(Refusal::LinkLocal)),
        ("169.254.0.1", Some(Refusal::LinkLocal)),
        ("fe80::1", Some(Refusal::LinkLocal)),
        ("febf::1", Some(Refusal::LinkLocal)),
        ("::ffff:169.254.1.1", Some(Refusal::LinkLocal)),
        ("169.255.0.1", None),
        ("169.253.255.255", None),
        ("fec0::1", None),
        ("fd00:ec2::253", None),
        ("100.100.100.201", None),
        ("127.0.0.1", None),
        ("10.0.0.1", None),
        ("::1", None),
    ] {
        assert_eq!(reserved(ip(addr)), want, "{addr}");
    }
}

/// `judge` on a host and what it resolved to.
fn check(l: &AllowList, host: &str, resolved: &[&str], want: Result<(), Refusal>) {
    let addrs: Vec<IpAddr> = resolved.iter().map(|a| ip(a)).collect();
    assert_eq!(l.judge(host, &addrs), want, "{host} -> {resolved:?}");
}

#[test]
fn without_a_list_only_reserved_hosts_are_refused_and_a_list_may_name_them() {
    let open = AllowList::default();
    check(&open, "10.0.0.7", &[], Ok(()));
    check(&open, "gpu-1.example", &["10.0.0.7"], Ok(()));
    check(&open, "gpu-1.example", &[], Ok(()));
    check(&open, "169.254.169.254", &[], Err(Refusal::Metadata));
    check(&open, "[fe80::1]", &[], Err(Refusal::LinkLocal));
    check(
        &open,
        "Metadata.Google.Internal.",
        &[],
        Err(Refusal::Metadata),
    );
    check(&open, "metadata", &[], Err(Refusal::Metadata));
    // A name is judged by every address it resolves to.
    check(
        &open,
        "imds.example",
        &["10.0.0.7", "169.254.169.254"],
        Err(Refusal::Metadata),
    );
    check(&open, "ll.example", &["fe80::2"], Err(Refusal::LinkLocal));
    assert!(!open.needs_lookup("metadata.google.internal"));
    assert!(!open.needs_lookup("169.254.169.254"));
    assert!(open.needs_lookup("gpu-1.example"));

    // A list that names them lets them through; one that does not refuses everything else.
    let named = list(&["169.254.169.254", "fe80::/10", "metadata.google.internal"]);
    check(&named, "169.254.169.254", &[], Ok(()));
    check(&named, "fe80::9", &[], Ok(()));
    check(&named, "metadata.google.internal", &[], Ok(()));
    assert!(!named.needs_lookup("metadata.google.internal"));
    let other = list(&["10.0.0.0/8"]);
    check(&other, "169.254.169.254", &[], Err(Refusal::NotListed));
    check(&other, "metadata", &[], Err(Refusal::NotListed));
    check(&other, "gpu-1.example", &["10.0.0.7"], Ok(()));
    check(
        &other,
        "gpu-1.example",
        &["10.0.0.7", "11.0.0.1"],
        Err(Refusal::NotListed),
    );
    check(&other, "gpu-1.example", &[], Err(Refusal::NotListed));
}

#[actix_rt::test]
async fn a_number_that_the_resolver_reads_as_an_address_is_judged_by_it() {
    // 2852039166 is 169.254.169.254 written as one number: not an address to Rust, but
    // the system resolver reads it as one (no query leaves the host).
    let open = AllowList::default();
    assert_eq!(
        open.check("2852039166", 80).await,
        Err(Refusal::Metadata),
        "the resolver's reading is judged"
    );
    assert_eq!(open.check("127.0.0.1", 80).await, Ok(()));
    assert_eq!(
        open.check("[fd00:ec2::254]", 80).await,
        Err(Refusal::Metadata)
    );
}
