//! The timeline of one attn_wgmma launch: a diagnostics build of the kernel (`TRACE=1`,
//! asked for with `trace` in [`crate::cuda::fwd::wgmma::TILE_ENV`]) in which thread 0 of every warpgroup
//! writes the SM clock at fixed points of its block's first [`ROUNDS`] tiles. The launcher
//! reads the buffer back after the launch and writes it as JSON to the file named by
//! [`TRACE_ENV`] (default `wgmma-trace.json`; each launch overwrites it), for
//! `scripts/gpu/wgmma-trace.py` to summarise. An experiment knob, like the tile override: the
//! launch synchronises its stream, and the default build contains none of it.

use crate::error::{AttnError, Result};
use serde::Serialize;

/// Environment variable naming the JSON file a traced launch writes.
pub const TRACE_ENV: &str = "FLASHATTN_WGMMA_TRACE";
/// Tiles (rounds) per block that are traced (kernels/fwd/attn_wgmma.cu `TRACE_ROUNDS`).
pub const ROUNDS: usize = 8;
/// Key tiles per round that are traced (`TRACE_ITERS`).
pub const ITERS: usize = 16;
/// First per-key-tile slot (`TRACE_ITER0`); each key tile has six.
pub const ITER0: usize = 16;
/// u32 slots per (block, round, warpgroup) (`TRACE_SLOTS`).
pub const SLOTS: usize = ITER0 + 6 * ITERS;

/// What each slot holds, for the reader of the JSON (clock values are the SM's cycle
/// counter, comparable only within a block).
const LAYOUT: &str = "data[((block * rounds + round) * roles + role) * slots + slot]; role 0 is the producer's thread 0, role c+1 consumer c's thread 0; a row of zeros was not reached. \
slot 0: tile (consumers: slot 1 its key tiles); 2-3: global timer (ns) at the round's start; \
producer clock: 4 after the Q-free wait, 5 Q issued, 6 every K/V load issued; per key tile n < 16 at 16+6n: +0 K issued, +1 V issued. \
consumer clock: 4 tile handed over, 5 Q arrived, 6 main loop done, 7 last P V done, 8 O store issued; per key tile n < 16 at 16+6n: \
+0 K arrived, +1 turn taken, +2 wgmmas issued (n > 0: after V arrived), +3 S done, +4 softmax done, +5 (n > 0) P V of n-1 done";

#[derive(Serialize)]
struct TraceFile<'a> {
    config: String,
    blocks: u32,
    rounds: usize,
    roles: u32,
    slots: usize,
    layout: &'static str,
    data: &'a [u32],
}

/// u32 elements of the trace buffer of a launch of `blocks` blocks whose tile has `consumers`
/// consumer warpgroups (plus the producer: `consumers + 1` roles). It takes the numbers rather
/// than the tile so that this file does not import the launcher that calls it.
pub fn buffer_len(consumers: u32, blocks: u32) -> usize {
    blocks as usize * ROUNDS * (consumers as usize + 1) * SLOTS
}

/// Writes a traced launch's buffer to the file named by [`TRACE_ENV`]; `config` is the tile's
/// description (its `Display`), `consumers` its consumer warpgroups.
///
/// # Errors
/// [`AttnError::Io`] when the file cannot be written.
pub fn write(config: &str, consumers: u32, blocks: u32, data: &[u32]) -> Result<()> {
    let path = std::env::var(TRACE_ENV).unwrap_or_else(|_| "wgmma-trace.json".into());
    write_to(&path, config, consumers, blocks, data)
}

/// Writes a traced launch's buffer as JSON to `path` (arguments as [`fn`]).
///
/// # Errors
/// [`AttnError::Io`] when the file cannot be written.
pub fn write_to(path: &str, config: &str, consumers: u32, blocks: u32, data: &[u32]) -> Result<()> {
    let file = TraceFile {
        config: config.to_string(),
        blocks,
        rounds: ROUNDS,
        roles: consumers + 1,
        slots: SLOTS,
        layout: LAYOUT,
        data,
    };
    let json = serde_json::to_vec(&file).map_err(|e| AttnError::InvalidInput {
        what: format!("wgmma trace: {e}"),
    })?;
    std::fs::write(path, json).map_err(|source| AttnError::Io {
        path: path.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_says_its_layout_and_holds_the_buffer() {
        // Two consumers, as the d128 default tile.
        let (config, consumers) = ("test tile", 2);
        let n = buffer_len(consumers, 2);
        assert_eq!(n, 2 * ROUNDS * 3 * SLOTS);
        let data: Vec<u32> = (0..n as u32).collect();
        let path =
            std::env::temp_dir().join(format!("flashattn-trace-{}.json", std::process::id()));
        let path = path.to_str().unwrap();
        write_to(path, config, consumers, 2, &data).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        std::fs::remove_file(path).unwrap();
        assert_eq!(v["blocks"], 2);
        assert_eq!(v["rounds"], ROUNDS);
        assert_eq!(v["roles"], 3);
        assert_eq!(v["slots"], SLOTS);
        assert_eq!(v["data"].as_array().unwrap().len(), n);
        assert_eq!(v["data"][n - 1], n - 1);
        // An unwritable path is a typed error naming it.
        let bad = std::env::temp_dir()
            .join("no-such-dir-flashattn")
            .join("t.json");
        match write_to(bad.to_str().unwrap(), config, consumers, 2, &data) {
            Err(AttnError::Io { path, .. }) => assert!(path.ends_with("t.json")),
            other => panic!("expected an Io error, got {other:?}"),
        }
    }
}
