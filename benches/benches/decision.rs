//! Micro-benchmarks of the per-request work that does not touch the
//! network: one decision of every limit kind, parsing a frame of 64
//! THROTTLEs, a shard table lookup at 1k, 1M and 10M keys, and a frame of
//! 64 lookups decided with and without prefetching their slots first.
//! Run with `cargo bench -p sluice-benches`.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use sluice_protocol::codec::{FrameDecoder, FrameWriter};
use sluice_protocol::gcra;
use sluice_protocol::limit::{
    concurrency, fixed_window, sliding_counter, sliding_log, Concurrency, Window,
};
use sluice_protocol::message::{Request, Throttle};
use sluice_protocol::routing::key_hash;
use sluice_protocol::Policy;
use sluice_server::shard::Table;
use tokio_util::codec::Decoder;

const S: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * S;

/// One decision per kind, on a bucket that admits (the common case), with
/// time moving 1 ms per call.
fn decision(c: &mut Criterion) {
    let mut g = c.benchmark_group("decision");
    g.throughput(Throughput::Elements(1));
    let policy = Policy::new(1_000, S, 100).unwrap();
    g.bench_function("token_bucket", |b| {
        let (mut now, mut state) = (T0, None);
        b.iter(|| {
            now += 1_000_000;
            let d = gcra::throttle(black_box(state), &policy, 1, now);
            state = d.bucket;
            d.verdict
        });
    });
    // The same decision as the shard runs it on a 24-byte slot: 64-bit,
    // on how far the TAT is ahead of now (in 2^-8 ns).
    g.bench_function("token_bucket_q8", |b| {
        let mut spent = 0u64;
        b.iter(|| {
            // 1 ms passes between calls: 256e6 units of 2^-8 ns.
            spent = spent.saturating_sub(256_000_000);
            let (v, new) = gcra::throttle_q8(black_box(spent), &policy, 1).expect("fits");
            spent = new;
            v
        });
    });
    // As a shard now runs it: the interval and its reciprocal from the
    // shard's one-policy memo, no division.
    g.bench_function("token_bucket_q8_memo", |b| {
        let mut spent = 0u64;
        let mut memo = gcra::IntervalMemo::default();
        b.iter(|| {
            spent = spent.saturating_sub(256_000_000);
            let (v, new) =
                gcra::throttle_q8_memo(black_box(spent), black_box(&policy), 1, &mut memo)
                    .expect("fits");
            spent = new;
            v
        });
    });
    let window = Window::new(1_000_000, 60 * S).unwrap();
    g.bench_function("fixed_window", |b| {
        let (mut now, mut state) = (T0, None);
        b.iter(|| {
            now += 1_000_000;
            let d = fixed_window::throttle(black_box(state), &window, 1, now);
            state = d.state;
            d.verdict
        });
    });
    g.bench_function("sliding_counter", |b| {
        let (mut now, mut state) = (T0, None);
        b.iter(|| {
            now += 1_000_000;
            let d = sliding_counter::throttle(black_box(state), &window, 1, now);
            state = d.state;
            d.verdict
        });
    });
    // A log of 100 in a 1 s window at one admission per ms: about 100
    // entries live, one expiring per admission, in steady state.
    let log_window = Window::new(1_000, S).unwrap();
    g.bench_function("sliding_log", |b| {
        let (mut now, mut state) = (T0, None);
        b.iter(|| {
            now += 10_000_000;
            let d = sliding_log::throttle(black_box(state.take()), &log_window, 1, now);
            state = d.state;
            d.verdict
        });
    });
    // Acquire, then release, of one of 10 slots.
    let conc = Concurrency::new(10, 30 * S).unwrap();
    g.bench_function("concurrency_acquire_release", |b| {
        let (mut now, mut id, mut state) = (T0, 0u64, None);
        b.iter(|| {
            now += 1_000;
            id += 1;
            let d = concurrency::acquire(black_box(state.take()), &conc, 1, id, now);
            let r = concurrency::release(d.state, &conc, id, now);
            state = r.decision.state;
            d.verdict
        });
    });
    g.finish();
}

fn codec(c: &mut Criterion) {
    let policy = Policy::new(1_000, S, 100).unwrap();
    let keys: Vec<String> = (0..64).map(|i| format!("client-{i:08}")).collect();
    let mut buf = BytesMut::new();
    let mut w = FrameWriter::new();
    for (i, k) in keys.iter().enumerate() {
        Request::Throttle(Throttle {
            key: k.as_bytes(),
            policy,
            cost: 1,
        })
        .encode(&mut w, &mut buf, i as u32);
    }
    w.finish(&mut buf);
    let wire = buf.freeze();
    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Elements(64));
    g.bench_function("decode_and_parse_64", |b| {
        let mut decoder = FrameDecoder::default();
        b.iter_batched(
            || BytesMut::from(&wire[..]),
            |mut src| {
                let frame = decoder.decode(&mut src).unwrap().unwrap();
                let mut cost = 0;
                for (h, p) in frame.messages() {
                    if let Ok(Request::Throttle(t)) = Request::parse(h, p) {
                        cost += t.cost;
                    }
                }
                black_box(cost)
            },
            BatchSize::SmallInput,
        );
    });
    g.finish();
}

/// A THROTTLE on a random existing key of a table holding N buckets that
/// stay spent (1 per hour): the cost of the lookup as the table outgrows
/// the caches.
fn table(c: &mut Criterion) {
    let policy = Policy::new(1, 3_600 * S, 10_000).unwrap();
    let mut g = c.benchmark_group("table_throttle");
    g.throughput(Throughput::Elements(1));
    for (label, n) in [("1k", 1_000u64), ("1M", 1_000_000), ("10M", 10_000_000)] {
        let mut t = Table::new();
        let keys: Vec<u128> = (0..n).map(|i| key_hash(&i.to_le_bytes())).collect();
        for &k in &keys {
            t.throttle(k, &policy, 1, T0)
                .expect("no cap on a bench table");
        }
        g.bench_function(label, |b| {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            b.iter(|| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let k = keys[(x % n) as usize];
                t.throttle(black_box(k), &policy, 1, T0 + 1)
            });
        });
    }
    g.finish();
    // What a connection does with a frame of 64 THROTTLEs: hash every key
    // first, then decide them in order. `plain`: no prefetch; `prefetched`:
    // every key's slot prefetched as it is hashed (what `connection.rs`
    // does); `window8`: the slot 8 keys ahead prefetched while deciding,
    // tried 2026-12-03: faster here at 10M keys, not end to end
    // (benches/notes.md, "A prefetch window"). Per decision.
    let mut g = c.benchmark_group("table_batch64");
    g.throughput(Throughput::Elements(64));
    for (label, n) in [("100k", 100_000u64), ("10M", 10_000_000)] {
        let mut t = Table::new();
        for i in 0..n {
            t.throttle(key_hash(&i.to_le_bytes()), &policy, 1, T0)
                .expect("no cap on a bench table");
        }
        for (variant, all, ahead) in [
            ("plain", false, 0),
            ("prefetched", true, 0),
            ("window8", false, 8),
        ] {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut hashes = [0u128; 64];
            g.bench_function(format!("{label}/{variant}"), |b| {
                b.iter(|| {
                    for h in &mut hashes {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        *h = key_hash(&(x % n).to_le_bytes());
                        if all {
                            t.prefetch(*h);
                        }
                    }
                    for &h in &hashes[..ahead] {
                        t.prefetch(h);
                    }
                    let mut allowed = 0u32;
                    for (i, &h) in hashes.iter().enumerate() {
                        if let (true, Some(&next)) = (ahead > 0, hashes.get(i + ahead)) {
                            t.prefetch(next);
                        }
                        let v = t
                            .throttle(black_box(h), &policy, 1, T0 + 1)
                            .expect("no cap");
                        allowed += u32::from(v.allowed);
                    }
                    allowed
                });
            });
        }
    }
    g.finish();
}

criterion_group!(benches, decision, codec, table);
criterion_main!(benches);
