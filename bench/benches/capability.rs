//! What a chunk capability costs (`tessera_core::capability`): a chunkserver checking
//! one before a read (HMAC-SHA256 over its fields, with every other check), and a master
//! signing one (a key derived from the cluster secret, then the MAC), beside the cost of
//! copying the 64 KiB a typical read returns, measured in the same run.
//!
//! `cargo bench -p tessera-bench --bench capability`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tessera_core::Time;
use tessera_core::auth::Caller;
use tessera_core::capability::{KeyRing, READ, ServerKeys, Want};
use tessera_core::pb;

fn capabilities(c: &mut Criterion) {
    let secret = [9u8; 32];
    let t0 = Time::from_millis(1_000);
    let mut keys = ServerKeys {
        server_id: 42,
        boot: 7,
        held: vec![],
        heard: t0,
        sent: None,
    };
    let key = keys.next_key(&secret, t0).expect("a first key");
    let mut ring = KeyRing::default();
    ring.take(t0, t0, &key);
    keys.held = ring.held(t0).iter().map(|k| (k.id, k.age_ms)).collect();
    let alice = Caller::Client {
        user: "alice".into(),
        groups: vec!["staff".into()],
    };
    let life = Duration::from_secs(60);
    let want = Want {
        handle: 5,
        version: 3,
        ops: READ,
    };
    let cap: pb::Capability = keys.issue(&secret, t0, life, want, &alice);
    assert_eq!(ring.check(t0, Some(&cap), want, &alice), Ok(()));
    let mut g = c.benchmark_group("capability");
    g.throughput(Throughput::Elements(1));
    g.bench_function("check", |b| {
        b.iter(|| ring.check(black_box(t0), Some(black_box(&cap)), want, &alice))
    });
    g.bench_function("sign", |b| {
        b.iter(|| keys.issue(&secret, black_box(t0), life, want, &alice))
    });
    let data = vec![7u8; 64 << 10];
    g.bench_function("baseline: copy 64 KiB", |b| {
        b.iter(|| black_box(&data).clone())
    });
    g.finish();
}

criterion_group!(benches, capabilities);
criterion_main!(benches);
