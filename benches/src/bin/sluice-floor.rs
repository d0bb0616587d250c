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
//! With `--resp-port N` it is also the RESP floor for redis-benchmark's
//! `CL.THROTTLE` row: the same RESP parser, the same command parse and the
//! same reply encoder as sluiced's RESP listener, a real `cell::throttle`
//! on a second 4,096-bucket array, and one write per read. Redis's own
//! PING is not a floor for that row: redis-benchmark spends about twice
//! the CPU on a CL.THROTTLE (a 12-digit key substituted per command, a
//! five-integer array parsed and freed per reply) that it spends on a
//! PING, so on a machine where it shares the cores with the server the
//! generator, not the server, sets the row's ceiling. This floor measures
//! that ceiling in the same run.
//!
//! With `--buckets N` (a power of two, 4,096 by default) the binary
//! protocol's array has N buckets instead: with N above the default, a
//! frame's keys are hashed and their buckets prefetched before the first
//! decision, as sluiced's shard does. That makes it the floor for a large
//! keyspace: one cache line per key and nothing else (no probing, no key
//! compare, no growth), so `--buckets 16777216` under 10M random keys
//! measures what this machine's memory allows at that size.
//!
//! Usage: `sluice-floor [--port N] [--resp-port N] [--buckets N]` (0, the
//! default for `--port`, picks a free one); prints `sluice-floor listening on ADDR`,
//! then `sluice-floor resp listening on ADDR` when asked for, and serves
//! until killed. Answers HELLO, PING and THROTTLE (RESP: CL.THROTTLE,
//! PING, and CONFIG GET with an empty array, which redis-benchmark asks at
//! start); closes a connection on anything else.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

use bytes::BytesMut;
use sluice_protocol::cell;
use sluice_protocol::codec::{FrameDecoder, FrameWriter};
use sluice_protocol::gcra::{self, Bucket};
use sluice_protocol::message::{
    put_hello_ok, put_pong, put_verdict, HelloOk, Request, RequestError,
};
use sluice_protocol::routing::{key_hash, ROUTING_XXH3_128_MULSHIFT};
use sluice_protocol::PROTOCOL_VERSION;
use sluice_server::resp::command::{self, Command, Reply};
use sluice_server::resp::parser::Parser;
use sluice_server::shard::bucket_map::prefetch_read_ptr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Decoder;

/// Buckets in each table unless `--buckets` says otherwise (a power of two).
const TABLE_BUCKETS: usize = 4096;
/// Most buckets `--buckets` may ask for: 2^28 slots of 32 bytes are 8 GiB.
const TABLE_BUCKETS_MAX: usize = 1 << 28;
/// Largest frame accepted (sluiced's default).
const FRAME_BYTES_MAX: u32 = 1 << 20;

type Table = Rc<RefCell<Vec<Option<Bucket>>>>;
/// The RESP floor's buckets: redis-cell's state, a theoretical arrival time.
type CellTable = Rc<RefCell<Vec<Option<u64>>>>;

/// sluiced's allocator, so that the ratio to this floor is the work's.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut port = 0u16;
    let mut resp_port = None;
    let mut buckets = TABLE_BUCKETS;
    while let Some(a) = args.next() {
        let parse_port = |p: &str| -> u16 {
            p.parse()
                .unwrap_or_else(|_| usage(&format!("bad port {p}")))
        };
        match (a.as_str(), args.next()) {
            ("--port", Some(p)) => port = parse_port(&p),
            ("--resp-port", Some(p)) => resp_port = Some(parse_port(&p)),
            ("--buckets", Some(n)) => {
                buckets = n
                    .parse()
                    .ok()
                    .filter(|n: &usize| n.is_power_of_two() && *n <= TABLE_BUCKETS_MAX)
                    .unwrap_or_else(|| usage(&format!("--buckets {n}: a power of two up to 2^28")))
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
        let table: Table = Rc::new(RefCell::new(vec![None; buckets]));
        // One clock for every connection: the buckets are shared, so their
        // times must be too. (Each connection had its own, started at its
        // accept: a bucket left by an earlier connection was then far in a
        // later one's future, and the floor denied every request, with no
        // bucket ever written.)
        let origin = std::time::Instant::now();
        if let Some(resp_port) = resp_port {
            let resp = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], resp_port)))
                .await
                .unwrap_or_else(|e| usage(&format!("cannot listen on port {resp_port}: {e}")));
            println!(
                "sluice-floor resp listening on {}",
                resp.local_addr().expect("a bound address")
            );
            let cells: CellTable = Rc::new(RefCell::new(vec![None; TABLE_BUCKETS]));
            tokio::task::spawn_local(async move {
                loop {
                    let Ok((stream, _)) = resp.accept().await else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::task::spawn_local(serve_resp(stream, cells.clone(), origin));
                }
            });
        }
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
    eprintln!("sluice-floor: {why}\nusage: sluice-floor [--port N] [--resp-port N] [--buckets N]");
    std::process::exit(2)
}

/// One connection: whole frames in, one write of their replies out.
async fn serve(mut stream: TcpStream, table: Table, origin: std::time::Instant) {
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
    let mut writer = FrameWriter::new();
    let (mut rbuf, mut wbuf) = (BytesMut::with_capacity(16 << 10), BytesMut::new());
    // A frame's bucket indexes, with a large table (reused: no allocation
    // per frame).
    let mut indexes: Vec<usize> = Vec::new();
    while read_more(&mut stream, &mut rbuf).await {
        let now_ns = origin.elapsed().as_nanos() as u64 + 1;
        loop {
            let frame = match decoder.decode(&mut rbuf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => return,
            };
            let mut table = table.borrow_mut();
            let mask = table.len() - 1;
            let index = |r: &Result<Request, RequestError>| match r {
                Ok(Request::Throttle(t)) => key_hash(t.key) as usize & mask,
                _ => 0,
            };
            let out = &mut (&mut writer, &mut wbuf);
            if table.len() <= TABLE_BUCKETS {
                for (h, payload) in frame.messages() {
                    let request = Request::parse(h, payload);
                    let i = index(&request);
                    if !answer(h.request_id, request, &mut table[i], now_ns, out) {
                        return;
                    }
                }
                continue;
            }
            // A large table: every key's bucket is loading before the first
            // decision waits for one. The requests are parsed twice (the
            // parse is a few bounds checks on bytes already in cache) rather
            // than kept: a frame's worth of parsed requests is kilobytes to
            // copy.
            indexes.clear();
            for (h, payload) in frame.messages() {
                let i = index(&Request::parse(h, payload));
                prefetch_read_ptr((&table[i] as *const Option<Bucket>).cast());
                indexes.push(i);
            }
            for ((h, payload), &i) in frame.messages().zip(indexes.iter()) {
                if !answer(
                    h.request_id,
                    Request::parse(h, payload),
                    &mut table[i],
                    now_ns,
                    out,
                ) {
                    return;
                }
            }
        }
        if !wbuf.is_empty() {
            writer.finish(&mut wbuf);
        }
        if !write_out(&mut stream, &mut wbuf).await {
            return;
        }
    }
}

/// Answers one request (a THROTTLE with `slot`, its key's bucket) into
/// `out`; false for a request the floor does not serve.
fn answer(
    request_id: u32,
    request: Result<Request, RequestError>,
    slot: &mut Option<Bucket>,
    now_ns: u64,
    (writer, wbuf): &mut (&mut FrameWriter, &mut BytesMut),
) -> bool {
    match request {
        Ok(Request::Throttle(t)) => {
            let d = gcra::throttle(*slot, &t.policy, t.cost, now_ns);
            *slot = d.bucket;
            put_verdict(writer, wbuf, request_id, false, &d.verdict);
        }
        Ok(Request::Hello(_)) => {
            let ok = HelloOk {
                version: PROTOCOL_VERSION,
                shard_count: 1,
                shard: None,
                routing: ROUTING_XXH3_128_MULSHIFT,
                node_id: 1,
                epoch: 0,
                features: 0,
            };
            put_hello_ok(writer, wbuf, request_id, &ok);
        }
        Ok(Request::Ping) => put_pong(writer, wbuf, request_id),
        _ => return false,
    }
    true
}

/// Reads what the socket has into `rbuf`; false at its end or an error.
async fn read_more(stream: &mut TcpStream, rbuf: &mut BytesMut) -> bool {
    if rbuf.capacity() - rbuf.len() < 4096 {
        rbuf.reserve(16 << 10);
    }
    matches!(stream.read_buf(rbuf).await, Ok(n) if n > 0)
}

/// Writes the replies in `wbuf` (if any) in one write; false on an error.
async fn write_out(stream: &mut TcpStream, wbuf: &mut BytesMut) -> bool {
    if wbuf.is_empty() {
        return true;
    }
    let ok = stream.write_all(wbuf).await.is_ok();
    wbuf.clear();
    ok
}

/// One RESP connection: whole commands in, one write of their replies out.
async fn serve_resp(mut stream: TcpStream, cells: CellTable, origin: std::time::Instant) {
    let mut parser = Parser::new(FRAME_BYTES_MAX as usize);
    let (mut rbuf, mut wbuf) = (BytesMut::with_capacity(16 << 10), BytesMut::new());
    while read_more(&mut stream, &mut rbuf).await {
        let now_ns = origin.elapsed().as_nanos() as u64 + 1;
        let mut used = 0;
        loop {
            let n = match parser.parse(&rbuf[used..]) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(_) => return,
            };
            let args = parser.args(&rbuf[used..]);
            let reply = match command::parse(&args) {
                Ok(Some(Command::Throttle(t))) => {
                    let mut cells = cells.borrow_mut();
                    let slot = &mut cells[key_hash(t.key) as usize & (TABLE_BUCKETS - 1)];
                    let d = cell::throttle(*slot, &t.policy, t.quantity, now_ns);
                    if !d.verdict.limited {
                        *slot = d.tat_ns;
                    }
                    Reply::Cell(d.verdict)
                }
                Ok(Some(Command::Ping(_))) => Reply::Simple("PONG"),
                Ok(Some(Command::ConfigGet(_))) => Reply::Array(Vec::new()),
                Ok(None) => {
                    used += n;
                    continue;
                }
                _ => return,
            };
            command::encode(&mut wbuf, &reply, 2);
            used += n;
        }
        let _ = rbuf.split_to(used);
        if !write_out(&mut stream, &mut wbuf).await {
            return;
        }
    }
}
