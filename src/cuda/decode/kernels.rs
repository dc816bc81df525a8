//! The kernels of a decoding call: attn_decode (with its tile's shared memory raised once),
//! kv_append with new rows, attn_combine with more than one split, each compiled (or found in
//! the module cache) with the defines of the call's features.

use super::tile::DecodeTile;
use crate::cuda::runtime::device::{Gpu, LoadedKernel};
use crate::cuda::runtime::launch::{launch_context, score_defines, set_dynamic_smem, sink_defines};
use crate::cuda::sources::KernelSource;
use crate::dtype::DType;
use crate::error::{AttnError, Result};
use crate::problem::kvcache::KvCacheShape;
use crate::shape::AttnProblem;

/// The kernels of a plan, compiled (or found in the module cache) once, with attn_decode's
/// shared-memory limit raised once.
pub(super) struct PlanKernels {
    pub decode: LoadedKernel,
    pub tile: DecodeTile,
    pub smem: usize,
    pub combine: Option<LoadedKernel>,
    pub append: Option<LoadedKernel>,
}

/// NVRTC defines of the optional features of a shape (none when they are off, so that a
/// call without them runs the same specialisation as before they existed): `HAS_BATCH_IDX`,
/// `HAS_LEFTPAD`, `ROTARY` and `ROTARY_INTERLEAVED`.
fn feature_defines(p: &KvCacheShape) -> Vec<(String, String)> {
    let on = |name: &str| (name.to_string(), "1".to_string());
    let mut d = Vec::new();
    if p.batch_idx {
        d.push(on("HAS_BATCH_IDX"));
    }
    if p.leftpad {
        d.push(on("HAS_LEFTPAD"));
    }
    if let Some(r) = &p.rotary {
        d.push(on("ROTARY"));
        if r.interleaved {
            d.push(on("ROTARY_INTERLEAVED"));
        }
    }
    d
}

impl PlanKernels {
    pub(super) fn new(
        gpu: &Gpu,
        p: &KvCacheShape,
        env: &AttnProblem,
        dtype: DType,
        tile: DecodeTile,
    ) -> Result<Self> {
        let allowed = gpu.info().smem_per_block_optin as usize;
        let smem = tile.smem_bytes(p.head_dim);
        if smem > allowed {
            return Err(AttnError::TooLarge {
                kernel: "attn_decode",
                reason: format!(
                    "head_dim {} needs {smem} bytes of shared memory per block, the device allows {allowed}: use the CPU backend",
                    p.head_dim
                ),
            });
        }
        let paged = p.is_paged();
        let features = feature_defines(p);
        let mut defines = tile.defines(dtype, p.head_dim, p.mask.is_causal(), paged);
        defines.extend(score_defines(env));
        defines.extend(sink_defines(env));
        defines.extend(features.iter().cloned());
        let decode = gpu.kernel(KernelSource::AttnDecode, "attn_decode", &defines)?;
        set_dynamic_smem(&decode.function, smem, &launch_context("attn_decode", env))?;
        let append = (p.seqlen_new > 0)
            .then(|| {
                gpu.kernel(
                    KernelSource::KvAppend,
                    "kv_append",
                    &append_defines(p, dtype),
                )
            })
            .transpose()?;
        Ok(PlanKernels {
            decode,
            tile,
            smem,
            combine: None,
            append,
        })
    }

    /// Compiles (or finds) attn_combine for a plan with more than one split (with the sink's
    /// define when the shape has one: the combine then adds it).
    pub(super) fn add_combine(&mut self, gpu: &Gpu, p: &KvCacheShape, dtype: DType) -> Result<()> {
        let mut defines = vec![
            ("HEAD_DIM".to_string(), p.head_dim.to_string()),
            (
                "IS_BF16".to_string(),
                u8::from(dtype == DType::BF16).to_string(),
            ),
        ];
        if p.scores.sink.is_some() {
            defines.push(("HAS_SINK".to_string(), "1".to_string()));
        }
        self.combine = Some(gpu.kernel(KernelSource::AttnCombine, "attn_combine", &defines)?);
        Ok(())
    }
}

/// kv_append's defines: HEAD_DIM, IS_PAGED and the features; IS_BF16 with a rotary embedding
/// only (the plain append copies bytes).
pub fn append_defines(p: &KvCacheShape, dtype: DType) -> Vec<(String, String)> {
    let mut d = vec![
        ("HEAD_DIM".to_string(), p.head_dim.to_string()),
        ("IS_PAGED".to_string(), u8::from(p.is_paged()).to_string()),
    ];
    d.extend(feature_defines(p));
    if p.rotary.is_some() {
        d.push((
            "IS_BF16".to_string(),
            u8::from(dtype == DType::BF16).to_string(),
        ));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::kvcache::{CacheDims, Rotary};

    #[test]
    fn features_off_add_no_defines() {
        let p = KvCacheShape {
            batch: 1,
            seqlen_q: 1,
            heads_q: 32,
            heads_kv: 8,
            head_dim: 128,
            cache: CacheDims::Contiguous {
                cache_batch: 1,
                seqlen_cache: 32768,
            },
            seqlen_new: 0,
            mask: crate::Mask::None,
            softmax_scale: 0.1,
            scores: Default::default(),
            rotary: None,
            batch_idx: false,
            leftpad: false,
        };
        assert!(feature_defines(&p).is_empty());
        assert_eq!(append_defines(&p, DType::BF16).len(), 2);
        let with = KvCacheShape {
            rotary: Some(Rotary {
                dim: 64,
                seqlen_ro: 40000,
                interleaved: true,
            }),
            seqlen_new: 1,
            leftpad: true,
            ..p
        };
        let names: Vec<_> = append_defines(&with, DType::BF16)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        for want in ["HAS_LEFTPAD", "ROTARY", "ROTARY_INTERLEAVED", "IS_BF16"] {
            assert!(names.iter().any(|n| n == want), "{want}");
        }
    }
}
