//! The ideal hit rate: what it counts, what it leaves out, and the engines' tokens it counts in.

use super::plans::spec;
use crate::*;

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
