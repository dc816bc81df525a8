//! The problem descriptions of packed variable-length batches ([`varlen`]) and of decoding
//! against a KV cache ([`kvcache`]): validation, layouts, the exact oracles and the CPU paths.
//! They sit beside [`crate::shape`] below both backends, so that [`crate::cuda`] can take them
//! without reaching up into [`crate::dispatch`], which decides where a call runs.

/// The `with_mask`/`with_scale`/`with_scores` builders of a problem type with public `mask`,
/// `softmax_scale`, `scores` and `heads_q` fields; `|p| batch` gives its sequence count. Both problem types take the same options with the same checks, so they share one
/// body (inherent methods: callers need no trait in scope).
macro_rules! option_builders {
    ($ty:ty, |$p:ident| $batch:expr) => {
        impl $ty {
            /// Sets the mask.
            pub fn with_mask(mut self, mask: crate::mask::Mask) -> Self {
                self.mask = mask;
                self
            }

            /// Sets `softmax_scale`.
            ///
            /// # Errors
            /// As [`crate::AttnProblem::with_scale`].
            pub fn with_scale(mut self, scale: f32) -> crate::error::Result<Self> {
                self.softmax_scale = crate::shape::check_scale(scale)?;
                Ok(self)
            }

            /// Sets the score modifiers (ALiBi slopes `[heads_q]` or `[batch, heads_q]`).
            ///
            /// # Errors
            /// Those of [`crate::scores::ScoreMods::validate`].
            pub fn with_scores(
                mut self,
                scores: crate::scores::ScoreMods,
            ) -> crate::error::Result<Self> {
                let $p = &self;
                scores.validate($batch, $p.heads_q)?;
                self.scores = scores;
                Ok(self)
            }
        }
    };
}

pub mod kvcache;
pub mod varlen;
pub mod varlen_device;
