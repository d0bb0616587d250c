//! Micro-benchmarks of the per-request work that does not touch the
//! network: one GCRA decision, parsing a THROTTLE, and decoding a frame of
//! 64 requests. Run with `cargo bench -p sluice-benches`.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sluice_protocol::codec::{FrameDecoder, FrameWriter};
use sluice_protocol::gcra;
use sluice_protocol::message::{Request, Throttle};
use sluice_protocol::Policy;
use tokio_util::codec::Decoder;

fn decision(c: &mut Criterion) {
    let policy = Policy::new(1_000, 1_000_000_000, 100).unwrap();
    let mut g = c.benchmark_group("gcra");
    g.throughput(Throughput::Elements(1));
    g.bench_function("throttle_allowed", |b| {
        let mut now = 1_700_000_000_000_000_000u64;
        let mut bucket = None;
        b.iter(|| {
            now += 1_000_000;
            let d = gcra::throttle(black_box(bucket), &policy, 1, now);
            bucket = d.bucket;
            d.verdict
        });
    });
    g.bench_function("throttle_denied", |b| {
        let now = 1_700_000_000_000_000_000u64;
        let spent = gcra::throttle(None, &policy, 100, now).bucket;
        b.iter(|| gcra::throttle(black_box(spent), &policy, 1, black_box(now)).verdict);
    });
    g.finish();
}

fn codec(c: &mut Criterion) {
    let policy = Policy::new(1_000, 1_000_000_000, 100).unwrap();
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
        b.iter(|| {
            let mut src = BytesMut::from(&wire[..]);
            let frame = decoder.decode(&mut src).unwrap().unwrap();
            let mut cost = 0;
            for (h, p) in frame.messages() {
                if let Ok(Request::Throttle(t)) = Request::parse(h, p) {
                    cost += t.cost;
                }
            }
            black_box(cost)
        });
    });
    g.finish();
}

criterion_group!(benches, decision, codec);
criterion_main!(benches);
