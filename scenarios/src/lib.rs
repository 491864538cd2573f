//! Named, seeded failure scenarios and their runner (issue 3).
//!
//! Not built yet: this crate holds its place in the workspace layout fixed by DESIGN.md.
