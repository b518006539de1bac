//! Stream parsing against the recorded SSE fixtures, in chunks of any size.

use tower_llm_core::{FailureClass, FinishReason};
use tower_llm_providers::stream::{
    MAX_EVENT, SseEvent, SseParser, StreamItem, anthropic_event, openai_event,
};

mod common;
use common::fixture;

fn events(bytes: &[u8], chunk: usize) -> Vec<SseEvent> {
    let mut p = SseParser::new();
    let mut out = Vec::new();
    for piece in bytes.chunks(chunk.max(1)) {
        out.extend(p.push(piece).expect("well-formed SSE"));
    }
    out
}

fn text_of(items: &[StreamItem]) -> String {
    items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Chunk(c) => c.text.clone(),
            _ => None,
        })
        .collect()
}

#[test]
fn chunk_boundaries_do_not_matter() {
    for name in [
        "openai_stream_basic.sse",
        "openai_stream_include_usage.sse",
        "anthropic_stream_basic.sse",
    ] {
        let bytes = fixture(name);
        let whole = events(&bytes, bytes.len());
        for size in [1, 2, 3, 7, 64] {
            assert_eq!(events(&bytes, size), whole, "{name} in {size}-byte chunks");
        }
        // CRLF line endings parse the same.
        let crlf = String::from_utf8(bytes.clone())
            .expect("utf-8")
            .replace('\n', "\r\n");
        assert_eq!(events(crlf.as_bytes(), 5), whole, "{name} with CRLF");
    }
}

#[test]
fn openai_basic_stream() {
    let items: Vec<_> = events(&fixture("openai_stream_basic.sse"), 13)
        .iter()
        .map(|e| openai_event(e).expect("ok"))
        .collect();
    assert_eq!(items.len(), 5);
    assert_eq!(text_of(&items), "Hello!");
    // The role-only first chunk has empty text: not the commit point.
    assert!(!items[0].is_content());
    assert!(items[1].is_content());
    match &items[3] {
        StreamItem::Chunk(c) => assert_eq!(c.finish_reason, Some(FinishReason::Stop)),
        other => panic!("{other:?}"),
    }
    assert_eq!(items[4], StreamItem::Done);
}

#[test]
fn openai_usage_and_midway_error() {
    let items: Vec<_> = events(&fixture("openai_stream_include_usage.sse"), 9)
        .iter()
        .map(|e| openai_event(e).expect("ok"))
        .collect();
    let usage = items.iter().rev().find_map(|i| match i {
        StreamItem::Chunk(c) => c.usage,
        _ => None,
    });
    assert_eq!(
        usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
        Some((19, 2))
    );

    let evs = events(&fixture("openai_stream_error_midway.sse"), 11);
    assert_eq!(evs.len(), 3);
    assert!(openai_event(&evs[1]).expect("content").is_content());
    let err = openai_event(&evs[2]).expect_err("in-band error");
    assert_eq!(err.class(), FailureClass::Transient);
    assert!(
        err.message()
            .is_some_and(|m| m.starts_with("The server had an error"))
    );
}

#[test]
fn anthropic_streams() {
    let items: Vec<_> = events(&fixture("anthropic_stream_basic.sse"), 17)
        .iter()
        .map(|e| anthropic_event(e).expect("ok"))
        .collect();
    assert_eq!(text_of(&items), "Hello!");
    assert_eq!(items.last(), Some(&StreamItem::Done));
    assert!(
        items.contains(&StreamItem::Skip),
        "ping and block markers are skipped"
    );
    let finish = items.iter().find_map(|i| match i {
        StreamItem::Chunk(c) => c.finish_reason,
        _ => None,
    });
    assert_eq!(finish, Some(FinishReason::Stop));
    let first_content = items.iter().position(StreamItem::is_content);
    assert_eq!(first_content, Some(3));

    let evs = events(&fixture("anthropic_stream_overloaded_first.sse"), 4);
    assert_eq!(evs[0].event.as_deref(), Some("error"));
    let err = anthropic_event(&evs[0]).expect_err("overloaded");
    assert!(err.is_transient());
    assert_eq!(err.message(), Some("Overloaded"));
}

#[test]
fn comments_multiline_data_and_limits() {
    let mut p = SseParser::new();
    let evs = p
        .push(b": keep-alive\n\ndata: a\ndata: b\n\nevent: x\n\n")
        .expect("ok");
    assert_eq!(
        evs,
        vec![SseEvent {
            event: None,
            data: "a\nb".into()
        }]
    );
    let mut p = SseParser::new();
    let huge = vec![b'x'; MAX_EVENT + 10];
    let mut line = b"data: ".to_vec();
    line.extend(huge);
    assert!(p.push(&line).expect_err("too big").is_invalid_response());
    let mut p = SseParser::new();
    assert!(
        p.push(b"data: \xff\xfe\n\n")
            .expect_err("not utf-8")
            .is_invalid_response()
    );
    assert!(
        openai_event(&SseEvent {
            event: None,
            data: "{oops".into()
        })
        .is_err()
    );
}

proptest::proptest! {
    #[test]
    fn any_split_gives_the_same_events(cut in 1usize..200) {
        let bytes = fixture("anthropic_stream_basic.sse");
        proptest::prop_assert_eq!(events(&bytes, cut), events(&bytes, bytes.len()));
    }

    #[test]
    fn any_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let mut p = SseParser::new();
        if let Ok(evs) = p.push(&bytes) {
            for e in evs {
                let _ = openai_event(&e);
                let _ = anthropic_event(&e);
            }
        }
    }
}
