//! Measures the master's memory per file and per chunk with a counting allocator.
//!
//! `cargo run --release -p tessera-bench --bin footprint [files]`
//!
//! Two namespaces are built through the master's own request path: one with `files`
//! empty files (per-file cost), one with files/10 files of 10 chunks each, three replicas
//! apiece (per-chunk cost, after taking off the files' share). Bytes are what the program
//! asked the allocator for, so allocator rounding and fragmentation are not included.
//!
//! On the second namespace it also measures what building a checkpoint for the store
//! costs beyond the state, at its peak: encoded piece by piece into parts, as the master
//! builds it (`Sealed::build`), against the whole checkpoint message built first, then
//! its whole sealed encoding, then the parts (as checkpoints were built before).
#![allow(unsafe_code)] // a GlobalAlloc must be an unsafe impl

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use tessera_bench::MasterHarness;
use tessera_core::driver::checkpoint::{self, Sealed};
use tessera_core::driver::master::seal;
use tessera_core::pb;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; we only count.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(l.size() as isize, Ordering::Relaxed) + l.size() as isize;
        PEAK.fetch_max(now, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let grow = new as isize - l.size() as isize;
        PEAK.fetch_max(
            LIVE.fetch_add(grow, Ordering::Relaxed) + grow,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// The most `f` held beyond what was live before it, at its peak, and what it returns.
fn peak<T>(f: impl FnOnce() -> T) -> (isize, T) {
    let before = live();
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (PEAK.load(Ordering::Relaxed) - before, out)
}

/// Builds `files` files in directories of 1000, each with `chunks` chunks; returns the
/// bytes the master holds for them (the harness itself allocates nothing that lasts).
fn build(files: usize, chunks: u64) -> (isize, MasterHarness) {
    let mut h = MasterHarness::new(12, 4);
    let before = live();
    for d in 0..files.div_ceil(1000) {
        h.mkdir(&format!("/warehouse/logs/d{d:05}"));
    }
    for i in 0..files {
        let p = format!("/warehouse/logs/d{:05}/part-{i:08}", i / 1000);
        h.create(&p);
        for c in 0..chunks {
            h.allocate(&p, c);
        }
    }
    // Measure the steady state: leases expired and forgotten, nothing queued.
    h.tick(std::time::Duration::from_secs(120));
    (live() - before, h)
}

fn main() {
    let files: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let (file_bytes, h) = build(files, 0);
    let per_file = file_bytes as f64 / files as f64;
    assert_eq!(h.master.meta().ns.file_count(), files as u64);
    drop(h);
    let chunked = files / 10;
    let (bytes, h) = build(chunked, 10);
    let chunks = h.master.meta().chunks.len();
    assert_eq!(chunks, chunked * 10);
    let per_chunk =
        (bytes as f64 - per_file * chunked as f64 - 8.0 * chunks as f64) / chunks as f64;
    println!("files={files} bytes={file_bytes} per_file={per_file:.1}");
    println!(
        "chunks={chunks} (3 replicas each) bytes={bytes} per_chunk={per_chunk:.1} (+8 per chunk in its file's handle list)"
    );

    let meta = h.master.meta();
    let (streamed, sealed) =
        peak(|| Sealed::build(1, meta.checkpoint_pieces(1), checkpoint::PART_BYTES));
    let (parts, stored) = sealed.size();
    drop(sealed);
    let (whole, _) = peak(|| {
        let cp = meta.checkpoint(1);
        let encoded = seal(&cp);
        drop(cp);
        let total = encoded.len() as u64;
        (0..encoded.len())
            .step_by(checkpoint::PART_BYTES)
            .map(|at| {
                seal(&pb::CheckpointPart {
                    offset: at as u64,
                    total,
                    data: encoded.slice(at..(at + checkpoint::PART_BYTES).min(encoded.len())),
                })
            })
            .collect::<Vec<_>>()
    });
    println!(
        "checkpoint of {chunked} files and {chunks} chunks: {stored} bytes in {parts} parts; \
         peak beyond the state while built: {streamed} in pieces ({:.2} of what is stored), \
         {whole} whole first ({:.2})",
        streamed as f64 / stored as f64,
        whole as f64 / stored as f64
    );
}
