use super::note::{TAIL, cached_tokens};
use super::*;

#[test]
fn cached_tokens_are_read_from_usage_and_meta_info_but_not_from_text() {
    let usage =
        br#"data: {"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens": 7}}}"#;
    assert_eq!(cached_tokens(usage), Some(7));
    let meta = br#"{"text":"x","meta_info":{"cached_tokens":12,"id":"a"}}"#;
    assert_eq!(cached_tokens(meta), Some(12));
    let text = br#"{"choices":[{"text":"say \"cached_tokens\": 5"}]}"#;
    assert_eq!(cached_tokens(text), None);
    assert_eq!(
        cached_tokens(br#"{"prompt_tokens_details":{"cached_tokens":null}}"#),
        None
    );
    assert_eq!(cached_tokens(b"no usage here"), None);
}

#[test]
fn the_last_cached_tokens_is_read_wherever_it_lies_from_the_tail() {
    let key = br#""cached_tokens":"#;
    // The last key starting at every place around the tail's edge, with an earlier
    // key far before it and filler after it.
    for after in [
        0,
        1,
        TAIL - key.len() - 3,
        TAIL - 5,
        TAIL - 1,
        TAIL,
        TAIL + 7,
        3000,
    ] {
        let mut b = br#"{"meta_info":{"cached_tokens":1},"x":""#.to_vec();
        b.extend(std::iter::repeat_n(b'a', 4000));
        b.extend_from_slice(br#"","usage":{"cached_tokens":42}"#);
        b.extend(std::iter::repeat_n(b' ', after));
        assert_eq!(cached_tokens(&b), Some(42), "{after} bytes after");
    }
    // Only the early one: found by the forward search.
    let mut b = br#"{"cached_tokens":3,"x":""#.to_vec();
    b.extend(std::iter::repeat_n(b'a', 5000));
    assert_eq!(cached_tokens(&b), Some(3));
    assert_eq!(cached_tokens(b""), None);
}

fn decided(request_id: &Arc<str>) -> Decided<'_> {
    Decided {
        request_id,
        model: None,
        endpoint: Endpoint::Completions,
        attempt: 1,
        worker_url: WorkerUrl::parse("http://w:1").unwrap(),
        text: true,
        bytes_per_token: 4.0,
        arrived: Instant::now(),
        stream: false,
    }
}

fn seqs(records: &[DecisionRecord]) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

#[test]
fn the_ring_keeps_the_newest_and_answers_after_a_sequence_number() {
    let sink = DecisionSink::new(3, Arc::new(Metrics::default()));
    let d = Decision::simple(WorkerId(1), kvgate_policies::DecisionPath::Load);
    let mut notes: Vec<AnswerNote> = (0..5)
        .map(|_| sink.decided(&mut d.clone(), decided(&Arc::from("r"))))
        .collect();
    notes[4].status(200);
    drop(notes);
    let all = sink.read(10, None);
    assert_eq!(seqs(&all), vec![3, 4, 5]);
    let outcomes: Vec<_> = all
        .iter()
        .map(|r| r.answer.as_ref().map(|a| a.outcome))
        .collect();
    assert_eq!(outcomes, [Some("failed"), Some("failed"), Some("ok")]);
    assert_eq!(seqs(&sink.read(1, Some(3))), vec![4]);
    assert_eq!(seqs(&sink.read(1, None)), vec![5]);
    // Wrapping round again keeps the order, oldest first.
    for _ in 0..4 {
        drop(sink.decided(&mut d.clone(), decided(&Arc::from("s"))));
    }
    assert_eq!(seqs(&sink.read(10, None)), vec![7, 8, 9]);
    assert_eq!(seqs(&sink.read(2, Some(7))), vec![8, 9]);
    assert_eq!(sink.paths_within(Duration::from_secs(60)), [("load", 3)]);
}

#[test]
fn an_answer_whose_slot_was_taken_is_dropped_and_a_record_has_its_time() {
    let sink = DecisionSink::new(2, Arc::new(Metrics::default()));
    let d = Decision::simple(WorkerId(1), kvgate_policies::DecisionPath::Hit);
    let mut late = sink.decided(&mut d.clone(), decided(&Arc::from("late")));
    late.status(200);
    drop(sink.decided(&mut d.clone(), decided(&Arc::from("a"))));
    drop(sink.decided(&mut d.clone(), decided(&Arc::from("b"))));
    drop(late);
    let all = sink.read(10, None);
    assert_eq!(seqs(&all), vec![2, 3]);
    assert!(all.iter().all(|r| r.request_id.as_str() != "late"));
    assert_eq!(all[0].request_id.as_str(), "a");
    let now_ms = (kvgate_core::clock::unix_now() * 1000.0) as u64;
    for r in &all {
        assert!(
            r.time_unix_ms.abs_diff(now_ms) < 5_000,
            "{}",
            r.time_unix_ms
        );
        assert_eq!(r.route, "/v1/completions");
    }
}
