//! Shared helpers for Tessera benchmarks.
