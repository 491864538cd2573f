//! Every decoder on arbitrary bytes, and what it hands them to (`tessera_core::fuzz::decode`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tessera_core::fuzz::decode::run(data);
});
