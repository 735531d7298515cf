//! The stable, CI-sized cousin of `fuzz/`: thousands of deterministic
//! mutations of valid request encodings go through the same decode +
//! validate path the handlers use ([`leaseq_server::fuzzing::decode_and_validate`]).
//! Nothing may panic, and every rejection must be a client error code.
//! The long, coverage-guided run is `cargo +nightly fuzz run decode` (see
//! docs/SECURITY.md).

use std::collections::HashMap;

use leaseq::pb;
use leaseq_server::fuzzing::{KINDS, Outcome, decode_and_validate};
use prost::Message;
use tonic::Code;

/// splitmix64: small, fast, and the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn dur(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos })
}

/// Valid (and nearly valid) encodings of every request kind, tagged with
/// their kind byte.
fn seeds() -> Vec<Vec<u8>> {
    let id = "0190b8a4-7c2e-7d41-9a55-3f1c2b7e9a10".to_string();
    let token = "5b0e6a59-0f0e-4f0b-8f58-6e3a1c1d2e3f".to_string();
    let job = |queue: &str| pb::EnqueueRequest {
        queue: queue.into(),
        payload: b"{\"hello\":\"world\"}".to_vec(),
        headers: HashMap::from([("content-type".into(), "application/json".into())]),
        priority: -3,
        delay: dur(5, 500),
        run_at: None,
        dedup_key: "k-1".into(),
        max_attempts: 7,
        ttl: dur(3600, 0),
        key: "customer-42".into(),
        unique_for: dur(60, 0),
        on_duplicate: pb::OnDuplicate::Replace as i32,
    };
    let tagged = |kind: u8, body: Vec<u8>| {
        let mut v = vec![kind];
        v.extend(body);
        v
    };
    vec![
        tagged(0, job("emails").encode_to_vec()),
        tagged(
            0,
            pb::EnqueueRequest {
                queue: "a".into(),
                run_at: Some(prost_types::Timestamp {
                    seconds: 1_900_000_000,
                    nanos: 0,
                }),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        tagged(
            1,
            pb::EnqueueBatchRequest {
                jobs: vec![job("a"), job("b.c"), job("d:e-f_g")],
            }
            .encode_to_vec(),
        ),
        tagged(
            2,
            pb::SubscribeRequest {
                queues: vec!["emails".into(), "orders".into()],
                consumer: "pod-1".into(),
                max_in_flight: 64,
                lease: dur(30, 0),
                accept: Vec::new(),
            }
            .encode_to_vec(),
        ),
        tagged(
            3,
            pb::AckRequest {
                job_id: id.clone(),
                lease_token: token.clone(),
                enqueue: Vec::new(),
                result: Vec::new(),
            }
            .encode_to_vec(),
        ),
        tagged(
            4,
            pb::NackRequest {
                job_id: id.clone(),
                lease_token: token.clone(),
                error: "boom".into(),
                retry_after: dur(0, 0),
                dead_letter: true,
            }
            .encode_to_vec(),
        ),
        tagged(
            5,
            pb::ExtendLeaseRequest {
                job_id: id,
                lease_token: token,
                lease: dur(60, 0),
            }
            .encode_to_vec(),
        ),
        tagged(6, b"Bearer fuzz-token".to_vec()),
        tagged(6, b"bearer  fuzz-token ".to_vec()),
    ]
}

/// Bytes that sit on the edges of varint and field parsing.
const INTERESTING: &[u8] = &[0x00, 0x01, 0x7f, 0x80, 0xff, 0x0a, 0x12, 0x1a, 0x08, 0x22];

fn mutate(rng: &mut Rng, input: &[u8], seeds: &[Vec<u8>]) -> Vec<u8> {
    // Byte 0 is the request kind: mutations change the body only.
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(2) {
        let len = v.len();
        match rng.below(8) {
            0 if len > 1 => {
                let i = 1 + rng.below(len - 1);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 1 => {
                let i = 1 + rng.below(len - 1);
                v[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let i = 1 + rng.below(len);
                v.insert(i, rng.next() as u8);
            }
            3 if len > 1 => {
                let i = 1 + rng.below(len - 1);
                v.remove(i);
            }
            4 if len > 1 => v.truncate(1 + rng.below(len - 1)),
            5 if len > 2 => {
                // Duplicate a chunk: repeated fields and overlong strings.
                let a = 1 + rng.below(len - 1);
                let b = (a + 1 + rng.below(16)).min(len);
                let chunk = v[a..b].to_vec();
                let at = 1 + rng.below(len - 1);
                v.splice(at..at, chunk);
            }
            6 => {
                // Splice the tail of another seed (keeps this one's kind).
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(v.len().max(1));
                let from = 1 + rng.below(other.len().saturating_sub(1).max(1));
                v.truncate(cut.max(1));
                v.extend_from_slice(&other[from.min(other.len())..]);
            }
            7 => {
                // A length prefix far beyond the input: must not allocate it.
                v.extend_from_slice(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]);
            }
            _ => {}
        }
    }
    v
}

#[test]
fn mutated_requests_never_panic_and_fail_with_client_errors() {
    let seeds = seeds();
    let kinds: std::collections::HashSet<u8> = seeds.iter().map(|s| s[0]).collect();
    assert_eq!(kinds.len(), KINDS as usize, "a seed for every request kind");
    // Every seed is a valid request.
    for s in &seeds {
        assert_eq!(decode_and_validate(s), Outcome::Accepted, "seed {s:?}");
    }
    let mut rng = Rng(0x1ea5_e0de_5eed);
    let mut tally: HashMap<Outcome, usize> = HashMap::new();
    // One pool of bases per request kind, taken in turn, so no kind crowds
    // out the others.
    let mut corpus: Vec<Vec<Vec<u8>>> = (0..KINDS)
        .map(|k| seeds.iter().filter(|s| s[0] == k).cloned().collect())
        .collect();
    for i in 0..6000 {
        let pool = &corpus[i % KINDS as usize];
        let base = pool[rng.below(pool.len())].clone();
        let input = mutate(&mut rng, &base, &seeds);
        let outcome = decode_and_validate(&input);
        assert!(
            outcome.is_client_error_or_ok(),
            "input {i} ({input:?}): {outcome:?}"
        );
        // Keep some decodable mutants as new bases, so mutations compound.
        let pool = &mut corpus[i % KINDS as usize];
        if outcome != Outcome::Undecodable && pool.len() < 64 && rng.below(4) == 0 {
            pool.push(input);
        }
        *tally.entry(outcome).or_default() += 1;
    }
    // Purely random kinds and bytes too.
    for _ in 0..2000 {
        let len = rng.below(64);
        let input: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let outcome = decode_and_validate(&input);
        assert!(outcome.is_client_error_or_ok(), "{input:?}: {outcome:?}");
    }
    eprintln!("outcomes: {tally:?}");
    // The mutations reach every branch: some inputs are accepted, some
    // rejected by validation, some undecodable.
    let rejected: usize = tally
        .iter()
        .filter(|(o, _)| matches!(o, Outcome::Rejected(_)))
        .map(|(_, n)| n)
        .sum();
    assert!(
        tally.get(&Outcome::Accepted).copied().unwrap_or(0) > 100,
        "{tally:?}"
    );
    assert!(rejected > 100, "{tally:?}");
    assert!(
        tally.get(&Outcome::Undecodable).copied().unwrap_or(0) > 100,
        "{tally:?}"
    );
    assert!(
        tally.contains_key(&Outcome::Rejected(Code::Unauthenticated)),
        "{tally:?}"
    );
}
