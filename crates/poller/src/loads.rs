//! SGLang `GET /v1/loads`: one JSON body, one [`RankLoad`] per data-parallel rank.

use kvgate_policies::RankLoad;
use serde::Deserialize;
use serde_json::Number;

use crate::error::ParseError;

/// More data-parallel ranks than any engine runs: a longer list is refused while it is
/// read, so a small body of `{}`s cannot become millions of stored ranks.
pub(crate) const MAX_RANKS: usize = 1024;

#[derive(Deserialize)]
struct Body {
    #[serde(deserialize_with = "at_most_max_ranks")]
    loads: Vec<Rank>,
}

fn at_most_max_ranks<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Rank>, D::Error> {
    struct Ranks;
    impl<'de> serde::de::Visitor<'de> for Ranks {
        type Value = Vec<Rank>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a list of at most {MAX_RANKS} ranks")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Vec<Rank>, A::Error> {
            let mut out = Vec::new();
            while let Some(r) = seq.next_element::<Rank>()? {
                if out.len() == MAX_RANKS {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_RANKS} ranks"
                    )));
                }
                out.push(r);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Ranks)
}

/// Per-rank fields; missing or null ones mean 0, unknown ones are ignored.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Rank {
    dp_rank: Option<Number>,
    num_running_reqs: Option<Number>,
    num_waiting_reqs: Option<Number>,
    num_waiting_uncached_tokens: Option<Number>,
    num_used_tokens: Option<Number>,
    max_total_num_tokens: Option<Number>,
    max_running_requests: Option<Number>,
    token_usage: Option<Number>,
    gen_throughput: Option<Number>,
    cache_hit_rate: Option<Number>,
    total_prefill_uncached_tokens: Option<Number>,
    total_prefill_busy_us: Option<Number>,
}

/// Parses a `/v1/loads` body into its ranks, in the order the engine listed them.
pub fn parse_v1_loads(body: &[u8]) -> Result<Vec<RankLoad>, ParseError> {
    let body: Body = serde_json::from_slice(body).map_err(|e| ParseError::Json(e.to_string()))?;
    if body.loads.is_empty() {
        return Err(ParseError::NoRanks);
    }
    Ok(body
        .loads
        .into_iter()
        .map(|r| RankLoad {
            dp_rank: u32::try_from(count(&r.dp_rank)).unwrap_or(u32::MAX),
            num_running_reqs: count(&r.num_running_reqs),
            num_waiting_reqs: count(&r.num_waiting_reqs),
            num_waiting_uncached_tokens: count(&r.num_waiting_uncached_tokens),
            num_used_tokens: count(&r.num_used_tokens),
            max_total_num_tokens: count(&r.max_total_num_tokens),
            max_running_requests: count(&r.max_running_requests),
            token_usage: real(&r.token_usage),
            gen_throughput: real(&r.gen_throughput),
            cache_hit_rate: real(&r.cache_hit_rate),
            total_prefill_uncached_tokens: count(&r.total_prefill_uncached_tokens),
            total_prefill_busy_us: count(&r.total_prefill_busy_us),
        })
        .collect())
}

/// A non-negative integer; floats are rounded, negatives become 0.
fn count(n: &Option<Number>) -> u64 {
    match n {
        None => 0,
        Some(n) => n
            .as_u64()
            .unwrap_or_else(|| crate::ranks::to_count(n.as_f64().unwrap_or(0.0))),
    }
}

fn real(n: &Option<Number>) -> f64 {
    crate::ranks::to_real(n.as_ref().and_then(Number::as_f64).unwrap_or(0.0))
}

#[cfg(test)]
mod tests;
