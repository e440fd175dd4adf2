use crate::http1::{decode_chunked, parse_head};
use crate::*;

fn spec(kind: WorkloadKind) -> WorkloadSpec {
    WorkloadSpec {
        groups: 3,
        prompts_per_group: 4,
        system_tokens: 100,
        question_tokens: 10,
        conversations: 3,
        turns: 3,
        burst_size: 5,
        max_tokens: 4,
        ..WorkloadSpec::new(kind)
    }
}

#[test]
fn plans_are_seeded_and_sized() {
    for kind in WorkloadKind::ALL {
        let s = spec(kind);
        let a = Plan::build(&s);
        assert_eq!(a, Plan::build(&s), "{kind}");
        let other = Plan::build(&WorkloadSpec {
            seed: 7,
            ..s.clone()
        });
        assert_ne!(a, other, "{kind}: another seed, other texts");
        let expect = match kind {
            WorkloadKind::SharedPrefix => 12,
            WorkloadKind::MultiTurn => 9,
            WorkloadKind::Burst => 5,
            WorkloadKind::Unique => 12,
        };
        assert_eq!(a.len(), expect, "{kind}");
    }
}

#[test]
fn texts_are_words_of_four_bytes() {
    let plan = Plan::build(&spec(WorkloadKind::SharedPrefix));
    for r in plan.requests() {
        assert_eq!(r.messages[0].content.len(), 100 * WORD_BYTES);
        assert_eq!(r.messages[1].content.len(), 10 * WORD_BYTES);
        assert!(r.messages.iter().all(|m| m.content.is_ascii()));
    }
    let unique = Plan::build(&spec(WorkloadKind::Unique));
    assert!(
        unique
            .requests()
            .all(|r| r.messages[0].content.len() == 110 * WORD_BYTES)
    );
}

#[test]
fn multi_turn_resends_its_history() {
    let plan = Plan::build(&spec(WorkloadKind::MultiTurn));
    for s in &plan.sessions {
        let turns: Vec<_> = s
            .requests
            .iter()
            .map(|r| render_chat(&r.messages))
            .collect();
        assert_eq!(turns.len(), 3);
        for pair in turns.windows(2) {
            // Each turn's prompt starts with the whole previous prompt.
            assert!(pair[1].starts_with(&pair[0]));
        }
    }
    let systems = |plan: &Plan| -> Vec<String> {
        plan.sessions
            .iter()
            .map(|s| s.requests[0].messages[0].content.clone())
            .collect()
    };
    let shared = systems(&plan);
    assert!(
        shared.windows(2).all(|w| w[0] == w[1]),
        "one shared system prompt"
    );
    let private = systems(&Plan::build(&WorkloadSpec {
        private_system: true,
        ..spec(WorkloadKind::MultiTurn)
    }));
    assert!(
        private.windows(2).all(|w| w[0] != w[1]),
        "a system prompt per conversation"
    );
}

#[test]
fn chat_rendering_matches_the_simulator_template() {
    let m = |role: &str, content: &str| Message {
        role: role.into(),
        content: content.into(),
    };
    let text = render_chat(&[m("system", "be brief"), m("user", "hi")]);
    assert_eq!(text, "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n");
}

/// A token per 4 bytes, for exact figures.
fn chunks() -> EngineTokens {
    EngineTokens::Stand(kvgate_engine_sim::Tokenizer::FourBytes)
}

fn sent_as_planned(plan: &Plan) -> Vec<Sent> {
    let tokens = chunks();
    plan.requests()
        .map(|r| Sent {
            prompt: tokens
                .chat(&r.messages)
                .expect("the stand-in encodes anything"),
            answer: Vec::new(),
        })
        .collect()
}

const POOL: usize = 200_000;

fn shape(page_size: usize) -> EngineShape {
    EngineShape {
        page_size,
        pool_tokens: POOL,
    }
}

#[test]
fn the_bound_counts_every_group_member_but_the_first() {
    let plan = Plan::build(&spec(WorkloadKind::SharedPrefix));
    let got = upper_bound(&sent_as_planned(&plan), shape(16));
    // "<|system|>\n" (11) + 400 + "\n<|user|>\n" (10) are shared: 421 bytes = 105 whole
    // tokens, 96 page-aligned. A prompt adds 40 + "\n<|assistant|>\n" (15): 476 bytes, 119 tokens.
    assert_eq!(got.prompt, 12 * 119);
    assert_eq!(got.cached, 3 * 3 * 96);
    // Without pages, the shared tokens themselves, and the template head ("<|system|>\n",
    // two whole tokens) that the first prompts of the later groups share with earlier ones.
    let unpaged = upper_bound(&sent_as_planned(&plan), shape(1));
    assert_eq!(unpaged.cached, 3 * 3 * 105 + 2 * 2);
}

fn ids(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

#[test]
fn the_bound_lets_a_turn_reuse_the_previous_prompt_and_its_answer() {
    // Turn 2 re-sends turn 1's prompt and the answer's ids, then asks more; an unrelated
    // request comes in between.
    let (p1, a1) = (ids(0..40), ids(100..110));
    let p2 = [p1.clone(), a1.clone(), ids(200..220)].concat();
    let sent = vec![
        Sent {
            prompt: p1,
            answer: a1,
        },
        Sent {
            prompt: ids(1000..1050),
            answer: Vec::new(),
        },
        Sent {
            prompt: p2,
            answer: ids(300..301),
        },
    ];
    let got = upper_bound(&sent, shape(16));
    assert_eq!(
        (got.prompt, got.cached),
        (40 + 50 + 70, 48),
        "50 shared, 3 pages"
    );
    let unpaged = upper_bound(&sent, shape(1));
    assert_eq!(unpaged.cached, 50);
    // A pool smaller than a conversation caps what it could keep.
    let small = upper_bound(
        &sent,
        EngineShape {
            page_size: 16,
            pool_tokens: 32,
        },
    );
    assert_eq!(small.cached, 32);
}

#[test]
fn the_bound_takes_the_closest_earlier_request_not_the_last() {
    // A template head every prompt shares, then two groups sent alternately: each prompt's
    // best match is its group's earlier one, whatever came in between.
    let head = ids(0..8);
    let group = |g: u32, q: u32| [head.clone(), ids(g * 1000..g * 1000 + 30), vec![q]].concat();
    let sent: Vec<Sent> = [(1, 1), (2, 2), (1, 3), (2, 4), (1, 5)]
        .into_iter()
        .map(|(g, q)| Sent {
            prompt: group(g, q),
            answer: Vec::new(),
        })
        .collect();
    let got = upper_bound(&sent, shape(1));
    // The first of group 2 shares the head; the three later ones their group's 38 tokens.
    assert_eq!(got.cached, 8 + 3 * 38);
    // An answer that differs from what the next turn re-sends (a template that strips
    // it) counts only up to where they part.
    let turn = vec![
        Sent {
            prompt: ids(0..20),
            answer: ids(50..60),
        },
        Sent {
            prompt: [ids(0..20), ids(51..60)].concat(),
            answer: Vec::new(),
        },
    ];
    assert_eq!(upper_bound(&turn, shape(1)).cached, 20);
}

#[test]
fn traffic_before_the_gateway_counts_as_earlier_but_not_in_the_totals() {
    let warm = vec![Sent {
        prompt: ids(0..30),
        answer: ids(90..95),
    }];
    let sent = vec![Sent {
        prompt: [ids(0..30), ids(40..50)].concat(),
        answer: Vec::new(),
    }];
    let got = upper_bound_after(&warm, &sent, shape(1));
    assert_eq!((got.prompt, got.cached), (40, 30));
    assert_eq!(upper_bound(&sent, shape(1)).cached, 0);
}

#[test]
fn a_warm_up_asks_each_group_once_what_the_plan_never_asks() {
    for kind in [WorkloadKind::SharedPrefix, WorkloadKind::MultiTurn] {
        let plan = Plan::build(&spec(kind));
        let warm = plan.warm_up(1);
        assert_eq!(warm, plan.warm_up(1), "{kind}: seeded");
        let groups: Vec<usize> = warm.requests().map(|r| r.group).collect();
        assert_eq!(groups.len(), 3, "{kind}: one per group");
        let mut first = std::collections::HashMap::new();
        for r in plan.requests() {
            first.entry(r.group).or_insert(r);
        }
        for w in warm.requests() {
            let planned = first[&w.group];
            let (head, last) = w.messages.split_at(w.messages.len() - 1);
            assert_eq!(head, &planned.messages[..planned.messages.len() - 1]);
            assert_eq!(last[0].role, "user");
            assert_eq!(
                last[0].content.len(),
                planned.messages[head.len()].content.len()
            );
            assert!(plan.requests().all(|r| r.messages.last() != last.first()));
        }
    }
}

#[test]
fn the_bound_leaves_the_last_token_to_compute() {
    let twice = vec![
        Sent {
            prompt: ids(0..35),
            answer: Vec::new(),
        };
        2
    ];
    let got = upper_bound(&twice, shape(1));
    assert_eq!((got.prompt, got.cached), (70, 34));
}

#[test]
fn unrelated_prompts_have_nothing_to_share() {
    for kind in [WorkloadKind::Burst, WorkloadKind::Unique] {
        let got = upper_bound(&sent_as_planned(&Plan::build(&spec(kind))), shape(16));
        assert_eq!(got.cached, 0, "{kind}");
        assert!(got.prompt > 0);
    }
}

/// The model tokenizer the KV-events runs use.
fn fixture() -> EngineTokens {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer");
    EngineTokens::load(kvgate_engine_sim::Tokenizer::default(), Some(&dir))
        .expect("the fixture loads")
}

#[test]
fn engine_tokens_follow_the_engines_template() {
    let m = |role: &str, content: &str| Message {
        role: role.into(),
        content: content.into(),
    };
    let chat = [m("system", "be brief "), m("user", "hi")];
    // The stand-in renders with the simulator's template.
    let stand = EngineTokens::Stand(kvgate_engine_sim::Tokenizer::WordPieces);
    assert_eq!(
        stand.chat(&chat).expect("stand-in"),
        kvgate_engine_sim::Tokenizer::WordPieces.encode(&render_chat(&chat))
    );
    // The model's template strips contents, so two chats differing only in a trailing
    // space are the same ids; the simulator's template keeps it.
    let model = fixture();
    let trimmed = [m("system", "be brief"), m("user", "hi")];
    assert_eq!(
        model.chat(&chat).expect("fixture"),
        model.chat(&trimmed).expect("fixture")
    );
    assert_ne!(
        stand.chat(&chat).expect("stand-in"),
        stand.chat(&trimmed).expect("stand-in")
    );
    // A plain text's ids carry no special tokens, as generated ids do not.
    let answer = model.answer(" the of and").expect("fixture");
    assert_eq!(answer.len(), 3);
}

#[test]
fn a_stand_in_turn_starts_with_the_previous_prompt_and_its_answer() {
    // With the simulator's template and tokenizer, the history re-sent is the very ids the
    // engine cached, so the bound can count all of it.
    let tokens = EngineTokens::Stand(kvgate_engine_sim::Tokenizer::WordPieces);
    let plan = Plan::build(&WorkloadSpec {
        private_system: true,
        ..spec(WorkloadKind::MultiTurn)
    });
    for s in &plan.sessions {
        let mut answers: Vec<String> = Vec::new();
        let mut before: Option<Vec<u32>> = None;
        for (t, r) in s.requests.iter().enumerate() {
            let mut messages = r.messages.clone();
            for (m, a) in messages
                .iter_mut()
                .filter(|m| m.role == "assistant")
                .zip(&answers)
            {
                m.content.clone_from(a);
            }
            let prompt = tokens.chat(&messages).expect("stand-in");
            if let Some(kept) = &before {
                assert!(prompt.starts_with(kept), "turn {t}");
            }
            let answer = " the kv of".repeat(t + 1);
            let mut kept = prompt;
            kept.extend(tokens.answer(&answer).expect("stand-in"));
            before = Some(kept);
            answers.push(answer);
        }
    }
}

#[test]
fn truncate_keeps_plan_order() {
    let mut plan = Plan::build(&spec(WorkloadKind::MultiTurn));
    let first = plan.sessions[0].clone();
    plan.truncate(4);
    assert_eq!(plan.len(), 4);
    assert_eq!(plan.sessions[0], first);
    assert_eq!(plan.sessions[1].requests.len(), 1);
}

#[test]
fn percentiles_by_nearest_rank() {
    let v: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(percentile(&v, 50.0), Some(50.0));
    assert_eq!(percentile(&v, 99.0), Some(99.0));
    assert_eq!(percentile(&v, 100.0), Some(100.0));
    assert_eq!(percentile(&v, 0.0), Some(1.0));
    assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
    assert_eq!(percentile(&[], 50.0), None);
    let s = Summary::of(&[3.0, 1.0, 2.0, f64::NAN]);
    assert_eq!((s.count, s.p50, s.max, s.mean), (3, 2.0, 3.0, 2.0));
    assert_eq!(Summary::of(&[]), Summary::default());
}

#[test]
fn split_ratio_is_max_over_min() {
    assert_eq!(split_ratio(&[8, 16, 12]), Some(2.0));
    assert_eq!(split_ratio(&[5, 0]), None);
    assert_eq!(split_ratio(&[]), None);
}

const WRK_OUT: &str = "Running 10s test @ http://127.0.0.1:8080/v1/chat/completions
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   635.91us    0.89ms  12.92ms   93.69%
    Req/Sec    56.20k     4.54k   70.34k    75.00%
  Latency Distribution
     50%  422.00us
     75%  539.00us
     90%    0.95ms
     99%    4.09ms
  559314 requests in 10.00s, 68.27MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 5
Requests/sec:  55917.71
Transfer/sec:      6.83MB
";

#[test]
fn wrk_output_parses() {
    let r = parse_wrk(WRK_OUT).expect("parses");
    assert_eq!(r.requests_per_sec, 55917.71);
    assert_eq!(r.requests, 559_314);
    assert_eq!(r.latency_avg_ms, Some(0.63591));
    assert_eq!(r.latency_p50_ms, Some(0.422));
    assert_eq!(r.latency_p99_ms, Some(4.09));
    assert_eq!(r.socket_errors, 3);
    assert_eq!(r.non_2xx, 5);
    assert!(parse_wrk("unable to connect to 127.0.0.1:1 Connection refused").is_err());
}

#[test]
fn wrk_script_posts_the_body_verbatim() {
    let script = post_script(r#"{"a":"]]"}"#);
    assert!(script.contains("wrk.method = \"POST\""));
    assert!(
        script.contains(r#"wrk.body = [=[{"a":"]]"}]=]"#),
        "{script}"
    );
}

#[test]
fn http_heads_and_chunked_bodies_parse() {
    let head = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nX: y\r\n\r\nhello";
    let h = parse_head(head).expect("valid").expect("complete");
    assert_eq!(
        (h.status, h.content_length, h.chunked, h.close),
        (200, Some(5), false, false)
    );
    assert_eq!(h.len, head.len() - 5);
    assert!(parse_head(b"HTTP/1.1 200 OK\r\n").expect("valid").is_none());
    assert!(parse_head(b"SSH-2.0\r\n\r\n").is_err());
    let h = parse_head(
        b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    )
    .expect("valid")
    .expect("complete");
    assert!(h.chunked && h.close && h.status == 404);

    let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nNEXT";
    let (decoded, used) = decode_chunked(body).expect("valid").expect("complete");
    assert_eq!(decoded, b"hello world");
    assert_eq!(&body[used..], b"NEXT");
    assert!(decode_chunked(&body[..12]).expect("valid").is_none());
    assert!(decode_chunked(b"zz\r\n").is_err());
}

#[test]
fn urls_resolve_to_socket_addrs() {
    let a = socket_addr("http://127.0.0.1:8080/x").expect("addr");
    assert_eq!(a.port(), 8080);
    assert!(socket_addr("https://127.0.0.1:1").is_none());
}

/// Tags open and close in order, attributes are quoted, `&` starts an entity: enough to
/// call the hand-written SVG well-formed without an XML dependency.
fn assert_well_formed(xml: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = xml;
    while let Some(lt) = rest.find('<') {
        check_text(&rest[..lt]);
        let gt = rest[lt..].find('>').expect("tag closes") + lt;
        let tag = &rest[lt + 1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "mismatched </{name}>"
            );
            continue;
        }
        let self_closing = tag.ends_with('/');
        let body = tag.trim_end_matches('/');
        let name = body.split_whitespace().next().expect("tag name");
        assert_eq!(
            body.matches('"').count() % 2,
            0,
            "unbalanced quotes in <{tag}>"
        );
        check_text(body);
        if !self_closing {
            stack.push(name.to_owned());
        }
    }
    check_text(rest);
    assert!(stack.is_empty(), "unclosed {stack:?}");
}

fn check_text(t: &str) {
    for (i, _) in t.match_indices('&') {
        let ent = &t[i..];
        assert!(
            ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                .iter()
                .any(|e| ent.starts_with(e)),
            "bare & in {t:?}"
        );
    }
    assert!(!t.contains('<'));
}

#[test]
fn svg_chart_is_well_formed_xml() {
    let panels = vec![
        Panel {
            title: "hit rate / ideal".into(),
            bars: vec![
                Bar {
                    label: "cache_aware".into(),
                    value: Some(0.97),
                },
                Bar {
                    label: "a<b & \"c\"".into(),
                    value: None,
                },
            ],
            target: Some((0.95, "target 0.95".into())),
        },
        Panel {
            title: "empty".into(),
            bars: vec![],
            target: None,
        },
    ];
    let svg = chart("kvgate <bench> & co", "sub", &panels);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_well_formed(&svg);
    assert!(svg.contains("a&lt;b &amp; &quot;c&quot;"));
    assert!(svg.contains("n/a"));
    assert_well_formed(&chart("none", "", &[]));
}

fn report(target: &str, split: Vec<u64>, cached: u64, p99: f64, reference: bool) -> RunReport {
    RunReport {
        workload: WorkloadKind::SharedPrefix,
        target: target.into(),
        reference,
        planned: 10,
        completed: 10,
        failed: 0,
        hits: Tokens {
            prompt: 1000,
            cached,
        },
        engine_counters: Tokens {
            prompt: 1000,
            cached,
        },
        ideal: Tokens {
            prompt: 1000,
            cached: 800,
        },
        ttft_ms: Summary {
            count: 10,
            p50: 1.0,
            p99,
            mean: 1.0,
            max: p99,
        },
        latency_ms: Summary::default(),
        wall_secs: 2.0,
        output_tokens: 160,
        split,
        capped: false,
        errors: vec![],
        setting: "4 engines".into(),
    }
}

#[test]
fn targets_name_what_a_run_misses() {
    let t = Targets::for_workload(WorkloadKind::SharedPrefix);
    let good = report("cache_aware", vec![3, 3, 3, 3], 790, 5.0, false);
    let smg = report("smg:cache_aware", vec![5, 5, 0, 0], 800, 6.0, true);
    assert!(t.misses(&good, Some(6.0)).is_empty());
    assert_eq!(good.req_per_sec(), 5.0);
    let bad = report("round_robin", vec![4, 2, 2, 2], 200, 9.0, false);
    assert_eq!(
        t.misses(&bad, Some(6.0)),
        vec!["ratio<0.97", "split>1.3", "ttft p99>ref"]
    );
    assert_eq!(t.misses(&smg, Some(6.0)), vec!["split>1.3"]);
    let rows = vec![good, bad, smg];
    assert_eq!(reference_p99(&rows), Some(6.0));
    let text = table(&rows);
    assert_eq!(text.lines().count(), 4);
    assert!(text.contains("3/3/3/3"));
    assert_well_formed(&workload_chart(&rows));

    let burst = Targets::for_workload(WorkloadKind::Burst);
    let mut b = report("least_load", vec![16, 16], 0, 1.0, false);
    b.workload = WorkloadKind::Burst;
    assert!(burst.misses(&b, None).is_empty());
    b.split = vec![19, 13];
    assert_eq!(burst.misses(&b, None).len(), 1);
}

#[test]
fn raw_client_reconnects_after_connection_close() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        for reply in [
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
            "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nyes\r\n0\r\n\r\n",
        ] {
            let (mut s, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).expect("request");
            s.write_all(reply.as_bytes()).expect("reply");
        }
    });
    let mut c = RawClient::connect(addr, std::time::Duration::from_secs(5)).expect("connect");
    let a = c.request("POST", "/x", b"{}").expect("first");
    assert_eq!((a.status, a.body.as_slice()), (200, &b"hi"[..]));
    let b = c
        .request("GET", "/y", b"")
        .expect("second, on a new connection");
    assert_eq!((b.status, b.body.as_slice()), (201, &b"yes"[..]));
    server.join().expect("server");
}
