//! The UI's conversation listing at scale: 100,000 stored conversations, and the first page, a deep
//! page (through its cursor) and a filtered page of `GET /ui/api/conversations` each answer in under
//! 200 ms (the listing reads the store's (updated, id) index, never every conversation). Figures
//! are printed; BENCHMARKS.md records them.

use std::time::{Duration, Instant};

use ctxscope_proxy::admin::ui::api::{conversation_page, list_filter};
use ctxscope_store::{ConversationRecord, FindingKind, FindingRecord, Severity, Store, StoreOptions};

const CONVERSATIONS: u64 = 100_000;
const BUDGET: Duration = Duration::from_millis(200);

fn conversation(id: u64) -> ConversationRecord {
    ConversationRecord {
        id,
        name: None,
        created_unix_ms: 1_700_000_000_000 + id * 1000,
        updated_unix_ms: 1_700_000_000_000 + id * 1000 + 500,
        upstream: "http://127.0.0.1:8000".into(),
        model: Some(
            match id % 10 {
                0 => "rare",
                _ => "common",
            }
            .into(),
        ),
        turns: 3,
        last_turn: id,
        last_head: String::new(),
        last_message_count: 6,
        last_tail: None,
        branch_of: None,
        last_reply: None,
        capture: Default::default(),
    }
}

fn timed(store: &Store, query: &str) -> (serde_json::Value, Duration) {
    let filter = list_filter(query).unwrap();
    let started = Instant::now();
    let page = conversation_page(store, &filter).unwrap();
    let took = started.elapsed();
    eprintln!("GET /ui/api/conversations?{query}: {} rows in {took:?}", page["conversations"].as_array().unwrap().len());
    assert!(took < BUDGET, "{query}: {took:?} is over {BUDGET:?}");
    (page, took)
}

#[test]
fn pages_of_100k_conversations_answer_within_200_ms() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let started = Instant::now();
    for id in 1..=CONVERSATIONS {
        store.put_conversation(&conversation(id)).unwrap();
        if id % 1000 < 1 {
            let finding = FindingRecord {
                id: CONVERSATIONS + id,
                kind: FindingKind::EngineTruncation,
                severity: Severity::Critical,
                time_unix_ms: 0,
                upstream: String::new(),
                model: None,
                conversation: id,
                turn: id,
                turn_index: 2,
                summary: String::new(),
                evidence: serde_json::json!({}),
                cause: format!("engine_truncation/{id}"),
            };
            store.put_finding(&finding).unwrap();
        }
    }
    eprintln!("filled {CONVERSATIONS} conversations in {:?}", started.elapsed());

    let (first, _) = timed(&store, "limit=50");
    let rows = first["conversations"].as_array().unwrap();
    assert_eq!((rows.len(), rows[0]["id"].as_u64()), (50, Some(CONVERSATIONS)));
    assert_eq!(rows[0]["findings"]["engine_truncation"], 1);
    // 1,000 pages in: the cursor of the conversation just above id 50,001.
    let (deep, _) = timed(&store, &format!("limit=50&cursor={}-{}", conversation(50_001).updated_unix_ms, 50_001));
    assert_eq!(deep["conversations"][0]["id"], 50_000);
    let (rare, _) = timed(&store, "limit=50&model=rare");
    assert!(rare["conversations"].as_array().unwrap().iter().all(|c| c["model"] == "rare"));
    let (kind, _) = timed(&store, "limit=50&kind=engine_truncation");
    assert_eq!(kind["conversations"].as_array().unwrap().len(), 50);
    let since = conversation(99_990).updated_unix_ms;
    let (recent, _) = timed(&store, &format!("since={since}"));
    assert_eq!(recent["conversations"].as_array().unwrap().len(), 11);

    // For comparison, the whole-store listing the JSON API has always had.
    let started = Instant::now();
    let all = store.conversations().unwrap();
    eprintln!("Store::conversations() (all {} records, sorted): {:?}", all.len(), started.elapsed());
}
