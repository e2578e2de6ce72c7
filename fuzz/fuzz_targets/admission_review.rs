//! Raw bytes as the body of `POST /mutate`, answered by `Webhook::answer` (what the HTTP handler
//! calls once it has read the body) with lookups served from memory.

#![no_main]

use std::sync::LazyLock;

use confighash::webhook::admission::Webhook;
use confighash_fuzz_checks::{check_admission, runtime, webhook};
use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;

static RUNTIME: LazyLock<Runtime> = LazyLock::new(runtime);
static WEBHOOK: LazyLock<Webhook> = LazyLock::new(webhook);

fuzz_target!(|body: &[u8]| {
    check_admission(&RUNTIME, &WEBHOOK, body);
});
