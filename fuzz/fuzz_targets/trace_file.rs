//! A trace file as a disk holds it (compressed or not), from arbitrary bytes
//! (`tessera_tracefile::fuzz`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tessera_tracefile::fuzz::run(data);
});
