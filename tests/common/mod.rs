//! Builders shared by the integration tests.

#![allow(dead_code)] // each test crate uses a subset

use flashattn::{AttnProblem, AttnShape, Mask};

/// A shape from its six sizes, in the order of [`AttnShape`]'s fields.
pub fn shape(b: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize) -> AttnShape {
    AttnShape::from_sizes([b, sq, sk, hq, hkv, d])
}

/// A validated problem with default scale and dense strides.
pub fn problem(
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    mask: Mask,
) -> AttnProblem {
    AttnProblem::new(shape(b, sq, sk, hq, hkv, d))
        .unwrap()
        .with_mask(mask)
}
