//! A pod spec as JSON (bare, or `{"spec": ..., "annotations": {...}}` with the workload's
//! annotations) into reference discovery.

#![no_main]

use confighash_fuzz_checks::{check_discovery, discovery_input};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Some((spec, annotations)) = discovery_input(bytes) {
        check_discovery(&spec, annotations.as_ref());
    }
});
