//! The head scanner's decisions against the httparse model, head by head.

use proptest::prelude::*;

use super::super::head::Look;
use super::model::{self, Parsed, TOKEN, head, judge, parse};

/// Every case: the scanner's decision is the model's, and nothing is put out unless the
/// body is taken.
fn agrees(input: &[u8], limit: usize, may_take: bool) -> Result<Look, TestCaseError> {
    let (got, out) = model::look(input, limit, may_take);
    let want = judge(input, limit, may_take);
    prop_assert_eq!(
        &got,
        &want,
        "{:?} limit {} may_take {}",
        String::from_utf8_lossy(input),
        limit,
        may_take
    );
    if !matches!(got, Look::Take { .. }) {
        prop_assert!(
            out.is_empty(),
            "put out {:?}",
            String::from_utf8_lossy(&out)
        );
    }
    Ok(got)
}

/// A taken head: httparse read it whole, with one `Content-Length` of digits and no
/// `Transfer-Encoding`; its rewrite is one head that httparse reads whole, to the same
/// request line and the same headers save the two the intake owns, which it adds once.
fn rewritten_as_contracted(input: &[u8], limit: usize) -> Result<(), TestCaseError> {
    let (got, out) = model::look(input, limit, true);
    let Look::Take { head, body } = got else {
        return Ok(());
    };
    let Parsed::Complete(sent) = parse(input) else {
        return Err(TestCaseError::fail(
            "took a head httparse does not read whole",
        ));
    };
    prop_assert_eq!(sent.len, head);
    let lengths: Vec<&[u8]> = sent.values("content-length").collect();
    prop_assert_eq!(lengths.len(), 1);
    prop_assert!(lengths[0].iter().all(u8::is_ascii_digit));
    prop_assert_eq!(
        std::str::from_utf8(lengths[0])
            .ok()
            .and_then(|v| v.parse().ok()),
        Some(body)
    );
    prop_assert!(!sent.has("transfer-encoding"));
    let Parsed::Complete(new) = parse(&out) else {
        return Err(TestCaseError::fail(format!(
            "the rewrite is no head httparse reads: {:?}",
            String::from_utf8_lossy(&out)
        )));
    };
    prop_assert_eq!(new.len, out.len(), "the rewrite is one head, and only that");
    prop_assert_eq!(
        (&new.method, &new.path, new.version),
        (&sent.method, &sent.path, sent.version)
    );
    let mut want = sent.kept();
    want.push(("content-length".into(), b"0".to_vec()));
    want.push(("x-kvgate-body".into(), TOKEN.to_string().into_bytes()));
    prop_assert_eq!(new.headers, want);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn the_scanner_decides_as_the_model(
        head in head(),
        after in model::after(),
        limit in 0usize..=400,
        may_take in prop::bool::weighted(0.8),
    ) {
        let mut input = head.to_vec();
        input.extend_from_slice(&after);
        let got = agrees(&input, limit, may_take)?;
        // A head httparse refuses is never rewritten: it and all after it pass.
        if matches!(parse(&input), Parsed::Refused) {
            prop_assert_eq!(got, Look::Raw);
        }
    }

    #[test]
    fn a_taken_head_is_rewritten_as_contracted(head in head(), limit in 1usize..=400) {
        rewritten_as_contracted(&head, limit)?;
    }
}

proptest! {
    // Every cut of each head: fewer heads.
    #![proptest_config(ProptestConfig::with_cases(384))]

    /// However a head is cut, its first part is not yet decided, or decided as the whole:
    /// the same way with the same output once the head is all there.
    #[test]
    fn a_head_cut_anywhere_decides_as_whole(
        head in head(),
        after in model::after(),
        limit in 1usize..=400,
    ) {
        let mut input = head.to_vec();
        input.extend_from_slice(&after);
        let (whole, whole_out) = model::look(&input, limit, true);
        let end = match whole {
            Look::Pass { head, .. } | Look::Take { head, .. } => head,
            Look::Raw | Look::Partial => input.len() + 1,
        };
        for cut in 0..input.len() {
            let (part, out) = model::look(&input[..cut], limit, true);
            if cut >= end {
                prop_assert_eq!(&part, &whole, "cut at {}", cut);
                prop_assert_eq!(&out, &whole_out, "cut at {}", cut);
            } else {
                prop_assert!(
                    part == Look::Partial || (part == Look::Raw && whole == Look::Raw),
                    "cut at {cut}: {part:?}, whole {whole:?}"
                );
            }
        }
    }
}
