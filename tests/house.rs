//! The house's own checks: the layout rules (tests/layout.rs), the layers (tests/layers.rs) and
//! that the docs say what the code does (tests/docs.rs).
//!
//! One test binary for several suites (issue 28): each suite is a module, run alone with
//! `cargo test --test house <module>::`.

mod docs;
mod layers;
mod layout;
