//! Metadata operations, checkpointed and recovered (`tessera_core::fuzz::oplog`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tessera_core::fuzz::oplog::run(data);
});
