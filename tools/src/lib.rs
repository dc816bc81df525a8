//! # flashattn-tools
//!
//! The lab around the [`flashattn`] library: the GPU checks against the f64 oracle
//! ([`check`]), the benchmarks and their plots ([`bench`]), and the fragment-layout probes of
//! the Tensor Core instructions ([`probe`], [`probe_wgmma`], with the layouts they are checked
//! against in [`layout`] and [`layout_wgmma`]). The `flashattn` binary (`src/main.rs`) is their
//! command line. Kept out of the library so that it, and the Python wheel built on it, compile
//! no clap, plotters, indicatif or font.

pub mod bench;
pub mod check;
pub mod layout;
pub mod layout_wgmma;
pub mod probe;
pub mod probe_wgmma;
pub mod probe_wgmma_fp8;
