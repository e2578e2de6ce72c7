//! What the benches share: the release binary run as `confighash serve` ([`serve`]), the
//! webhook benches' fixture ([`fixture`]), the smoke mode `cargo test` runs them in ([`mode`]) and
//! reading a Prometheus scrape ([`prom`]).

pub mod fixture;
pub mod mode;
pub mod prom;
pub mod serve;
