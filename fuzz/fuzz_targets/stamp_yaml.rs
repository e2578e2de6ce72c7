//! The YAML input of `confighash stamp`: up to four files, separated by NUL bytes, stamped by
//! `offline::run` (what the command runs once it has read its files).

#![no_main]

use confighash_fuzz_checks::{check_stamp_yaml, stamp_sources};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Some(sources) = stamp_sources(bytes) {
        check_stamp_yaml(&sources);
    }
});
