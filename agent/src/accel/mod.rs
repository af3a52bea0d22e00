//! Accelerators: GPU and TPU health, one path for every kind.
//!
//! `model` is the one health scale, `policy` the [`policy::Accelerator`] trait each kind
//! implements (health, reasons, the Node's desired fields: a row of `policy::Names`), `tracker`
//! the one generic tracker that publishes a kind's health. Each kind is a folder: its data
//! (`model`), its pure rules (`policy*`), its monitor loop (`monitor`) and the adapter that
//! reads the hardware (`gpu::nvml`, `tpu::chips`). A third kind is one such folder and a row.

pub mod gpu;
pub mod model;
pub mod policy;
pub mod tpu;
pub(crate) mod tracker;
