use super::*;

fn proxies(nets: &[&str]) -> TrustedProxies {
    TrustedProxies::new(nets.iter().map(|n| n.parse().expect("net")).collect())
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn the_first_hop_not_trusted_from_the_right_is_the_client() {
    let p = proxies(&["10.0.0.0/8"]);
    let peer = ip("10.0.0.2");
    let xff = |v: &[&str]| p.client_of(peer, &strings(v), &[]);
    assert_eq!(xff(&["203.0.113.7"]), ip("203.0.113.7"));
    // A client that writes its own header: the proxy appended the address it saw.
    assert_eq!(xff(&["1.1.1.1, 203.0.113.7"]), ip("203.0.113.7"));
    // Through two trusted proxies, over two header lines.
    assert_eq!(
        xff(&["198.51.100.4, 10.0.0.9", "10.0.0.3"]),
        ip("198.51.100.4")
    );
    // Ports and brackets.
    assert_eq!(xff(&["203.0.113.7:5555"]), ip("203.0.113.7"));
    assert_eq!(xff(&["[2001:db8::7]:5555"]), ip("2001:db8::7"));
    assert_eq!(xff(&["2001:db8::7"]), ip("2001:db8::7"));
    assert_eq!(xff(&["::ffff:203.0.113.7"]), ip("203.0.113.7"));
    // Nothing named, or nothing readable: the nearest address known.
    assert_eq!(xff(&[]), peer);
    assert_eq!(xff(&["unknown"]), peer);
    assert_eq!(xff(&["203.0.113.7, garbage, 10.0.0.9"]), ip("10.0.0.9"));
    // Only trusted hops: the farthest.
    assert_eq!(xff(&["10.1.1.1, 10.0.0.9"]), ip("10.1.1.1"));
}

#[test]
fn forwarded_is_read_when_there_is_no_x_forwarded_for() {
    let p = proxies(&["10.0.0.0/8"]);
    let peer = ip("10.0.0.2");
    let fwd = |v: &[&str]| p.client_of(peer, &[], &strings(v));
    assert_eq!(fwd(&["for=203.0.113.7"]), ip("203.0.113.7"));
    assert_eq!(
        fwd(&["for=1.1.1.1, For=\"[2001:db8::7]:4711\";proto=https"]),
        ip("2001:db8::7")
    );
    assert_eq!(
        fwd(&["proto=https;for=203.0.113.7;by=10.0.0.2"]),
        ip("203.0.113.7")
    );
    assert_eq!(fwd(&["for=_hidden"]), peer);
    assert_eq!(fwd(&["proto=https"]), peer);
    // X-Forwarded-For wins when both are sent.
    assert_eq!(
        p.client_of(
            peer,
            &strings(&["198.51.100.4"]),
            &strings(&["for=203.0.113.7"])
        ),
        ip("198.51.100.4")
    );
}

#[actix_rt::test]
async fn an_untrusted_peer_is_its_own_client() {
    use actix_web::test::TestRequest;
    let req = |peer: &str| {
        TestRequest::default()
            .peer_addr(peer.parse().expect("addr"))
            .insert_header(("x-forwarded-for", "203.0.113.7"))
            .to_http_request()
    };
    let p = proxies(&["10.0.0.0/8"]);
    assert_eq!(p.client_ip(&req("192.0.2.1:4000")), Some(ip("192.0.2.1")));
    assert_eq!(p.client_ip(&req("10.0.0.2:4000")), Some(ip("203.0.113.7")));
    assert_eq!(
        p.client_ip(&req("[::ffff:10.0.0.2]:4000")),
        Some(ip("203.0.113.7"))
    );
    let none = TrustedProxies::default();
    assert_eq!(none.client_ip(&req("10.0.0.2:4000")), Some(ip("10.0.0.2")));
}
