//! The loopback floor: about the least a server can do and still answer
//! `sluice bench` in protocol v1, so that `benches/compare.sh` can put
//! Sluice's throughput next to what this machine allows at all.
//!
//! One thread, one tokio current-thread runtime, every connection a task
//! on it: read, split whole frames off (the same `FrameDecoder`), parse
//! each request (the same `Request::parse`), decide THROTTLE with the real
//! GCRA function on a 4,096-bucket array indexed by the key hash's low
//! bits (a small table that stays in cache: keys that share an index
//! share a bucket, which a real limiter must never do), encode the replies
//! (the same encoders) and write them in one write per read. No shards, no
//! forwarding, no key table that grows, no auth, no replication, no
//! metrics, no limits: what it leaves out is what Sluice's ratio to it
//! measures.
//!
//! Usage: `sluice-floor [--port N]` (0, the default, picks a free port);
//! prints `sluice-floor listening on ADDR` and serves until killed.
//! Answers HELLO, PING and THROTTLE; closes a connection on anything else.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

use bytes::BytesMut;
use sluice_protocol::codec::{FrameDecoder, FrameWriter};
use sluice_protocol::gcra::{self, Bucket};
use sluice_protocol::message::{put_hello_ok, put_pong, put_verdict, HelloOk, Request};
use sluice_protocol::routing::{key_hash, ROUTING_XXH3_128_MULSHIFT};
use sluice_protocol::PROTOCOL_VERSION;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Decoder;

/// Buckets in the table (a power of two).
const TABLE_BUCKETS: usize = 4096;
/// Largest frame accepted (sluiced's default).
const FRAME_BYTES_MAX: u32 = 1 << 20;

type Table = Rc<RefCell<Vec<Option<Bucket>>>>;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut port = 0u16;
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--port", Some(p)) => {
                port = p
                    .parse()
                    .unwrap_or_else(|_| usage(&format!("bad port {p}")))
            }
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .unwrap_or_else(|e| usage(&format!("cannot listen on port {port}: {e}")));
        let addr = listener.local_addr().expect("a bound address");
        println!("sluice-floor listening on {addr}");
        let table: Table = Rc::new(RefCell::new(vec![None; TABLE_BUCKETS]));
        // One clock for every connection: the buckets are shared, so their
        // times must be too. (Each connection had its own, started at its
        // accept: a bucket left by an earlier connection was then far in a
        // later one's future, and the floor denied every request, with no
        // bucket ever written.)
        let origin = std::time::Instant::now();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::task::spawn_local(serve(stream, table.clone(), origin));
        }
    });
}

fn usage(why: &str) -> ! {
    eprintln!("sluice-floor: {why}\nusage: sluice-floor [--port N]");
    std::process::exit(2)
}

/// One connection: whole frames in, one write of their replies out.
async fn serve(mut stream: TcpStream, table: Table, origin: std::time::Instant) {
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
    let mut writer = FrameWriter::new();
    let (mut rbuf, mut wbuf) = (BytesMut::with_capacity(16 << 10), BytesMut::new());
    loop {
        if rbuf.capacity() - rbuf.len() < 4096 {
            rbuf.reserve(16 << 10);
        }
        match stream.read_buf(&mut rbuf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let now_ns = origin.elapsed().as_nanos() as u64 + 1;
        loop {
            let frame = match decoder.decode(&mut rbuf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => return,
            };
            let mut table = table.borrow_mut();
            for (h, payload) in frame.messages() {
                match Request::parse(h, payload) {
                    Ok(Request::Throttle(t)) => {
                        let slot = &mut table[key_hash(t.key) as usize & (TABLE_BUCKETS - 1)];
                        let d = gcra::throttle(*slot, &t.policy, t.cost, now_ns);
                        *slot = d.bucket;
                        put_verdict(&mut writer, &mut wbuf, h.request_id, false, &d.verdict);
                    }
                    Ok(Request::Hello(_)) => {
                        let ok = HelloOk {
                            version: PROTOCOL_VERSION,
                            shard_count: 1,
                            shard: None,
                            routing: ROUTING_XXH3_128_MULSHIFT,
                            node_id: 1,
                            epoch: 0,
                        };
                        put_hello_ok(&mut writer, &mut wbuf, h.request_id, &ok);
                    }
                    Ok(Request::Ping) => put_pong(&mut writer, &mut wbuf, h.request_id),
                    _ => return,
                }
            }
        }
        if !wbuf.is_empty() {
            writer.finish(&mut wbuf);
            if stream.write_all(&wbuf).await.is_err() {
                return;
            }
            wbuf.clear();
        }
    }
}
