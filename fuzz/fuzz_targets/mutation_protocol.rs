//! The mutation protocol over the pure state machines in an in-process world, every step
//! checked, every replica judged at the end (`tessera_sim::fuzz`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tessera_sim::fuzz::run(data);
});
