//! The deterministic simulator (issue 3): a madsim runtime, simulated disks, fault injection and checkers.
//!
//! Not built yet: this crate holds its place in the workspace layout fixed by DESIGN.md.
