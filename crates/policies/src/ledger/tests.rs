//! §6 scenarios 6 (second half), 8 and 15: credit bookkeeping.

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Records `dispatches` (tokens, at ms) for one worker, publishes `reports` (sample ms, or
/// `None` for a report without a sample time) and checks the remaining credit.
fn check(dispatches: &[(u64, u64)], reports: &[Option<u64>], expect: (u64, u64)) {
    let w = WorkerId(1);
    let mut l = CreditLedger::new();
    for &(tokens, at) in dispatches {
        l.record(w, tokens, ms(at));
    }
    for r in reports {
        l.on_report(w, r.map(ms));
    }
    assert_eq!(
        l.credit(w),
        Credit {
            tokens: expect.0,
            requests: expect.1
        }
    );
}

#[test]
fn s08_dispatches_after_the_sample_stay_credited() {
    let three = [(1024, 10), (1024, 20), (1024, 40)];
    check(&three, &[], (3072, 3));
    check(&three, &[Some(30)], (1024, 1));
    // Republishing the same report changes nothing.
    check(&three, &[Some(30), Some(30)], (1024, 1));
    // A dispatch at exactly the sample instant is covered.
    check(&three, &[Some(40)], (0, 0));
    // A report with no sample time resets.
    check(&three, &[Some(30), None], (0, 0));
    check(&three, &[None], (0, 0));
}

#[test]
fn s15_remove_and_clear_forget_the_credit() {
    let mut l = CreditLedger::new();
    l.record(WorkerId(1), 10, ms(1));
    l.record(WorkerId(2), 20, ms(1));
    l.remove(WorkerId(1));
    assert_eq!(l.credit(WorkerId(1)), Credit::default());
    assert_eq!(l.credit(WorkerId(2)).tokens, 20);
    l.clear();
    assert_eq!(l.credit(WorkerId(2)), Credit::default());
}

#[test]
fn bounded_per_worker_dropping_the_oldest() {
    let mut l = CreditLedger::new();
    for i in 0..(CreditLedger::MAX_DISPATCHES as u64 + 10) {
        l.record(WorkerId(1), i, ms(i));
    }
    let c = l.credit(WorkerId(1));
    assert_eq!(c.requests, CreditLedger::MAX_DISPATCHES as u64);
    let kept: u64 = (10..CreditLedger::MAX_DISPATCHES as u64 + 10).sum();
    assert_eq!(c.tokens, kept);
}

#[test]
fn apply_credits_the_chosen_worker_only() {
    let mut l = CreditLedger::new();
    let d = Decision {
        credit_tokens: 7,
        ..Decision::simple(WorkerId(3), crate::DecisionPath::Hit)
    };
    l.apply(&d, ms(1));
    l.apply(&Decision::none(), ms(2));
    assert_eq!(
        l.credit(WorkerId(3)),
        Credit {
            tokens: 7,
            requests: 1
        }
    );
    assert_eq!(l.credit(WorkerId(4)), Credit::default());
}

#[test]
fn a_finished_dispatch_releases_its_credit_once() {
    let w = WorkerId(1);
    let mut l = CreditLedger::new();
    l.record(w, 100, ms(1));
    l.record(w, 50, ms(2));
    l.release(w, ms(1), 100);
    assert_eq!(
        l.credit(w),
        Credit {
            tokens: 50,
            requests: 1
        }
    );
    // Already gone (released, or covered by a report): nothing changes.
    l.release(w, ms(1), 100);
    l.on_report(w, Some(ms(5)));
    l.release(w, ms(2), 50);
    assert_eq!(l.credit(w), Credit::default());
}
