//! Measures the master's memory per file and per chunk with a counting allocator.
//!
//! `cargo run --release -p tessera-bench --bin footprint [files]`
//!
//! Two namespaces are built through the master's own request path: one with `files`
//! empty files (per-file cost), one with files/10 files of 10 chunks each, three replicas
//! apiece (per-chunk cost, after taking off the files' share). Bytes are what the program
//! asked the allocator for, so allocator rounding and fragmentation are not included.
#![allow(unsafe_code)] // a GlobalAlloc must be an unsafe impl

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use tessera_bench::MasterHarness;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; we only count.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
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
}
