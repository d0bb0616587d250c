//! Cluster routing schemes compared: which shard group owns a key.
//!
//! `sluice_protocol::ring::Ring` (rendezvous hashing over the groups' names)
//! against two alternatives kept only here: a consistent-hash ring with
//! virtual nodes (100 and 1000 points per group), and jump consistent hash
//! over the list of groups. All three score the same `ring::key_bits`.
//!
//! Before criterion runs, this prints the balance and movement of each
//! scheme over 100,000 keys (`client:{i}`); criterion then measures one
//! lookup at 3, 10 and 100 groups. Run with
//! `cargo bench -p sluice-benches --bench ring` (`-- --quick` for a short
//! run). The results are in the doc of `protocol/src/ring.rs`.

use std::hint::black_box;

use criterion::Criterion;
use sluice_protocol::ring::{key_bits, mix64, name_hash, Ring};
use sluice_protocol::routing::key_hash;

/// A way to pick a group for a key.
trait Scheme {
    /// Builds the scheme over `names` (unique).
    fn build(names: &[String]) -> Self;
    /// The name of the owner of `hash` (a `key_hash`).
    fn owner(&self, hash: u128) -> &str;
}

/// The chosen scheme.
struct Rendezvous(Ring);

impl Scheme for Rendezvous {
    fn build(names: &[String]) -> Self {
        Rendezvous(Ring::new(names.to_vec()))
    }

    #[inline]
    fn owner(&self, hash: u128) -> &str {
        self.0.owner(hash)
    }
}

/// A consistent-hash ring: `V` points per group at
/// `mix64(name_hash + j × φ)`, `j in 1..=V`; a key belongs to the first
/// point at or after its `key_bits` (wrapping). Equal points are ordered by
/// name, so the result depends only on the set of names.
struct VnodeRing<const V: usize> {
    points: Vec<u64>,
    owners: Vec<u32>,
    names: Vec<String>,
}

impl<const V: usize> Scheme for VnodeRing<V> {
    fn build(names: &[String]) -> Self {
        let mut all: Vec<(u64, &str, u32)> = Vec::with_capacity(names.len() * V);
        for (g, name) in names.iter().enumerate() {
            let h = name_hash(name);
            for j in 1..=V as u64 {
                let p = mix64(h.wrapping_add(j.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
                all.push((p, name, g as u32));
            }
        }
        all.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        VnodeRing {
            points: all.iter().map(|p| p.0).collect(),
            owners: all.iter().map(|p| p.2).collect(),
            names: names.to_vec(),
        }
    }

    #[inline]
    fn owner(&self, hash: u128) -> &str {
        let k = key_bits(hash);
        let mut i = self.points.partition_point(|&p| p < k);
        if i == self.points.len() {
            i = 0;
        }
        &self.names[self.owners[i] as usize]
    }
}

/// Jump consistent hash (Lamping & Veach, 2014) over the list of groups:
/// bucket numbers `0..n`, so it depends on the list's order.
struct Jump {
    names: Vec<String>,
}

fn jump(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

impl Scheme for Jump {
    fn build(names: &[String]) -> Self {
        Jump {
            names: names.to_vec(),
        }
    }

    #[inline]
    fn owner(&self, hash: u128) -> &str {
        &self.names[jump(key_bits(hash), self.names.len() as u32) as usize]
    }
}

const KEYS: usize = 100_000;
const SETS: usize = 20;

fn names(set: usize, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("set{set}-group-{i}")).collect()
}

fn moved<A: Scheme, B: Scheme>(a: &A, b: &B, keys: &[u128], to: Option<&str>) -> (f64, bool) {
    let mut moved = 0;
    let mut only_to = true;
    for &h in keys {
        let (x, y) = (a.owner(h), b.owner(h));
        if x != y {
            moved += 1;
            if let Some(t) = to {
                only_to &= y == t;
            }
        }
    }
    (moved as f64 / keys.len() as f64, only_to)
}

fn max_over_mean<S: Scheme>(s: &S, n: usize, keys: &[u128], names: &[String]) -> f64 {
    let mut counts = vec![0usize; n];
    for &h in keys {
        let o = s.owner(h);
        counts[names.iter().position(|x| x == o).expect("a group")] += 1;
    }
    *counts.iter().max().expect("groups") as f64 * n as f64 / keys.len() as f64
}

/// Balance and movement of scheme `S`, averaged (and the worst) over
/// `SETS` name sets.
fn quality<S: Scheme>(label: &str, keys: &[u128]) {
    let (mut bal10, mut worst10, mut bal100, mut add, mut rm) = (0.0, 0.0f64, 0.0, 0.0, 0.0);
    let mut add_only_new = true;
    for set in 0..SETS {
        let ten = names(set, 10);
        let s10 = S::build(&ten);
        let b = max_over_mean(&s10, 10, keys, &ten);
        bal10 += b;
        worst10 = worst10.max(b);
        let hundred = names(set, 100);
        bal100 += max_over_mean(&S::build(&hundred), 100, keys, &hundred);
        let eleven = names(set, 11);
        let (f, only) = moved(&s10, &S::build(&eleven), keys, Some(&eleven[10]));
        add += f;
        add_only_new &= only;
        let mut nine = ten.clone();
        nine.remove(4);
        rm += moved(&s10, &S::build(&nine), keys, None).0;
    }
    let m = SETS as f64;
    println!(
        "| {label:<14} | {:.3} (worst {:.3}) | {:.3} | {:.2}% ({}) | {:.2}% |",
        bal10 / m,
        worst10,
        bal100 / m,
        100.0 * add / m,
        if add_only_new {
            "all to the new group"
        } else {
            "some between old groups"
        },
        100.0 * rm / m,
    );
}

fn print_quality() {
    let keys: Vec<u128> = (0..KEYS)
        .map(|i| key_hash(format!("client:{i}").as_bytes()))
        .collect();
    println!("balance and movement over {KEYS} keys, mean of {SETS} name sets");
    println!(
        "| scheme | max/mean at 10 | max/mean at 100 | moved on add 10->11 (ideal 9.09%) | moved on removing the 5th of 10 (ideal ~10%) |"
    );
    println!("|---|---|---|---|---|");
    quality::<Rendezvous>("rendezvous", &keys);
    quality::<VnodeRing<100>>("vnodes x100", &keys);
    quality::<VnodeRing<1000>>("vnodes x1000", &keys);
    quality::<Jump>("jump (list)", &keys);
}

fn lookups<S: Scheme>(c: &mut Criterion, label: &str) {
    let keys: Vec<u128> = (0..1024u32)
        .map(|i| key_hash(format!("client:{i}").as_bytes()))
        .collect();
    let mut g = c.benchmark_group(format!("ring/{label}"));
    for n in [3, 10, 100] {
        let s = S::build(&names(0, n));
        g.bench_function(n.to_string(), |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) & 1023;
                s.owner(black_box(keys[i])).len()
            });
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    print_quality();
    lookups::<Rendezvous>(&mut c, "rendezvous");
    lookups::<VnodeRing<100>>(&mut c, "vnodes_x100");
    lookups::<VnodeRing<1000>>(&mut c, "vnodes_x1000");
    lookups::<Jump>(&mut c, "jump");
    c.final_summary();
}
