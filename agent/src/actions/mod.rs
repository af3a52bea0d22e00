//! Write adapters: alerts and pages. (Restarts go through `crate::runtime`.)

pub mod alert;
