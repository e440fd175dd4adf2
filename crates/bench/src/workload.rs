//! Workload plans: seeded prompt texts grouped into sessions whose requests go in order.
//!
//! Every text is ASCII words of three letters and a space, N of them for "N tokens"; how
//! many tokens that really is depends on the engine's tokenizer.

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Bytes of one word of plan text (three letters and a space).
pub const WORD_BYTES: usize = 4;

/// The traffic shapes the benchmark knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// G groups × P prompts; a group's prompts share one system prompt.
    SharedPrefix,
    /// Conversations that re-send their history each turn; all share one system prompt,
    /// or each has its own (`WorkloadSpec::private_system`).
    MultiTurn,
    /// Unrelated short prompts sent all at once.
    Burst,
    /// Prompts as long as shared-prefix ones with nothing shared: the cache cannot help.
    Unique,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 4] = [
        WorkloadKind::SharedPrefix,
        WorkloadKind::MultiTurn,
        WorkloadKind::Burst,
        WorkloadKind::Unique,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::SharedPrefix => "shared-prefix",
            WorkloadKind::MultiTurn => "multi-turn",
            WorkloadKind::Burst => "burst",
            WorkloadKind::Unique => "unique",
        }
    }
}

impl std::fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A workload name that is not one of [`WorkloadKind::ALL`].
#[derive(Debug, thiserror::Error)]
#[error("unknown workload '{0}' (expected shared-prefix, multi-turn, burst or unique)")]
pub struct UnknownWorkload(pub String);

impl std::str::FromStr for WorkloadKind {
    type Err = UnknownWorkload;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WorkloadKind::ALL
            .into_iter()
            .find(|k| k.name() == s || k.name().replace('-', "_") == s)
            .ok_or_else(|| UnknownWorkload(s.to_owned()))
    }
}

/// The sizes of every workload; each kind reads the fields it needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    pub kind: WorkloadKind,
    pub groups: usize,
    pub prompts_per_group: usize,
    pub system_tokens: usize,
    pub question_tokens: usize,
    pub conversations: usize,
    pub turns: usize,
    pub burst_size: usize,
    /// Completion length asked of every request (`max_tokens`).
    pub max_tokens: usize,
    /// Multi-turn: each conversation has its own system prompt, so nothing is shared
    /// between conversations.
    pub private_system: bool,
    pub seed: u64,
}

impl WorkloadSpec {
    /// The reference measurements' sizes for `kind`.
    pub fn new(kind: WorkloadKind) -> WorkloadSpec {
        WorkloadSpec {
            kind,
            groups: 8,
            prompts_per_group: 16,
            system_tokens: 1000,
            question_tokens: 50,
            conversations: 16,
            turns: 4,
            burst_size: 32,
            max_tokens: 16,
            private_system: false,
            seed: 42,
        }
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    fn new(role: &str, content: String) -> Message {
        Message {
            role: role.to_owned(),
            content,
        }
    }
}

/// One request of a plan. `group` names the requests that may share a cached prefix: the
/// prompt group in shared-prefix, the conversation in multi-turn, the request itself
/// otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedRequest {
    pub group: usize,
    pub messages: Vec<Message>,
}

/// Requests that go one after another, each after the previous one's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub requests: Vec<PlannedRequest>,
}

/// Everything one run sends, in the order it is released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub kind: WorkloadKind,
    pub sessions: Vec<Session>,
    pub max_tokens: usize,
}

impl Plan {
    /// Builds the plan; the same spec always gives the same plan.
    pub fn build(spec: &WorkloadSpec) -> Plan {
        let mut rng = SmallRng::seed_from_u64(spec.seed);
        let sessions = match spec.kind {
            WorkloadKind::SharedPrefix => shared_prefix(spec, &mut rng),
            WorkloadKind::MultiTurn => multi_turn(spec, &mut rng),
            WorkloadKind::Burst => singles(spec.burst_size, spec.question_tokens, &mut rng),
            WorkloadKind::Unique => singles(
                spec.groups * spec.prompts_per_group,
                spec.system_tokens + spec.question_tokens,
                &mut rng,
            ),
        };
        Plan {
            kind: spec.kind,
            sessions,
            max_tokens: spec.max_tokens,
        }
    }

    /// All requests, session by session.
    pub fn requests(&self) -> impl Iterator<Item = &PlannedRequest> {
        self.sessions.iter().flat_map(|s| s.requests.iter())
    }

    pub fn len(&self) -> usize {
        self.sessions.iter().map(|s| s.requests.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Traffic the engines served before the gateway started: for each group, in the order
    /// groups first appear, its first request with the last user message replaced by a
    /// question of the same length that the plan never asks. One session per group.
    pub fn warm_up(&self, seed: u64) -> Plan {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x0a11_3a2d);
        let mut seen = std::collections::HashSet::new();
        let sessions = self
            .requests()
            .filter(|r| seen.insert(r.group))
            .map(|r| {
                let mut messages = r.messages.clone();
                if let Some(m) = messages.iter_mut().rev().find(|m| m.role == "user") {
                    m.content = text(&mut rng, m.content.len() / WORD_BYTES);
                }
                Session {
                    requests: vec![PlannedRequest {
                        group: r.group,
                        messages,
                    }],
                }
            })
            .collect();
        Plan {
            kind: self.kind,
            sessions,
            max_tokens: self.max_tokens,
        }
    }

    /// Keeps at most `cap` requests, dropping whole sessions from the end and then the tail
    /// of the last one, so order and grouping stay as planned.
    pub fn truncate(&mut self, cap: usize) {
        let mut left = cap;
        self.sessions.retain_mut(|s| {
            let keep = s.requests.len().min(left);
            s.requests.truncate(keep);
            left -= keep;
            keep > 0
        });
    }
}

fn shared_prefix(spec: &WorkloadSpec, rng: &mut SmallRng) -> Vec<Session> {
    let systems: Vec<String> = (0..spec.groups)
        .map(|_| text(rng, spec.system_tokens))
        .collect();
    let mut order: Vec<(usize, usize)> = (0..spec.groups)
        .flat_map(|g| (0..spec.prompts_per_group).map(move |p| (g, p)))
        .collect();
    order.shuffle(rng);
    order
        .into_iter()
        .map(|(g, _)| Session {
            requests: vec![PlannedRequest {
                group: g,
                messages: vec![
                    Message::new("system", systems[g].clone()),
                    Message::new("user", text(rng, spec.question_tokens)),
                ],
            }],
        })
        .collect()
}

fn multi_turn(spec: &WorkloadSpec, rng: &mut SmallRng) -> Vec<Session> {
    let shared = text(rng, spec.system_tokens);
    (0..spec.conversations)
        .map(|c| {
            let system = if spec.private_system {
                text(rng, spec.system_tokens)
            } else {
                shared.clone()
            };
            let mut history = vec![Message::new("system", system)];
            let mut requests = Vec::with_capacity(spec.turns);
            for _ in 0..spec.turns {
                history.push(Message::new("user", text(rng, spec.question_tokens)));
                requests.push(PlannedRequest {
                    group: c,
                    messages: history.clone(),
                });
                // A placeholder: the replay re-sends the engine's real answer in its place.
                history.push(Message::new("assistant", text(rng, spec.max_tokens)));
            }
            Session { requests }
        })
        .collect()
}

fn singles(n: usize, tokens: usize, rng: &mut SmallRng) -> Vec<Session> {
    (0..n)
        .map(|i| Session {
            requests: vec![PlannedRequest {
                group: i,
                messages: vec![Message::new("user", text(rng, tokens))],
            }],
        })
        .collect()
}

/// `tokens` tokens of seeded text: three random letters and a space per token, so two texts
/// part ways within their first token.
fn text(rng: &mut SmallRng, tokens: usize) -> String {
    let mut s = String::with_capacity(tokens * WORD_BYTES);
    for _ in 0..tokens {
        for _ in 0..WORD_BYTES - 1 {
            s.push(char::from(b'a' + rng.gen_range(0..26u8)));
        }
        s.push(' ');
    }
    s
}
