//! Seeded plans: their sizes, texts and the history a conversation re-sends.

use crate::*;

pub(super) fn spec(kind: WorkloadKind) -> WorkloadSpec {
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

#[test]
fn truncate_keeps_plan_order() {
    let mut plan = Plan::build(&spec(WorkloadKind::MultiTurn));
    let first = plan.sessions[0].clone();
    plan.truncate(4);
    assert_eq!(plan.len(), 4);
    assert_eq!(plan.sessions[0], first);
    assert_eq!(plan.sessions[1].requests.len(), 1);
}
