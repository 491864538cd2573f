//! Throughput of the pure master state machine on one core: creating a file and
//! allocating its first chunk (lease grant included, chunkservers answering at once, the
//! log reported durable at once), and looking up a file's chunk locations.
//!
//! `cargo bench -p tessera-bench --bench master`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tessera_bench::MasterHarness;

fn create_and_allocate(c: &mut Criterion) {
    let mut g = c.benchmark_group("master");
    g.throughput(Throughput::Elements(1));
    let mut h = MasterHarness::new(30, 5);
    h.mkdir("/bench");
    let mut i = 0u64;
    g.bench_function("create+allocate", |b| {
        b.iter(|| {
            i += 1;
            let p = format!("/bench/d{}/f{i}", i / 10_000);
            if i.is_multiple_of(10_000) || i == 1 {
                h.mkdir(&format!("/bench/d{}", i / 10_000));
            }
            h.create(&p);
            h.allocate(&p, 0)
        })
    });
    let mut h = MasterHarness::new(30, 5);
    h.mkdir("/lookup");
    let n = 100_000u64;
    for i in 0..n {
        let p = format!("/lookup/f{i}");
        h.create(&p);
        h.allocate(&p, 0);
    }
    let mut j = 0u64;
    g.bench_function("chunk-locations", |b| {
        b.iter(|| {
            j = (j + 7919) % n;
            h.locations(&format!("/lookup/f{j}"))
        })
    });
    g.finish();
}

criterion_group!(benches, create_and_allocate);
criterion_main!(benches);
