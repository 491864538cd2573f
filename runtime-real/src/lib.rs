//! The production runtime and the tessera binary (issue 5).
//!
//! Not built yet: this crate holds its place in the workspace layout fixed by DESIGN.md.
