//! How a bench with `harness = false` was started, from its arguments, so that each one behaves
//! as libtest's would.
//!
//! - `--list` (`cargo bench -- --list`, `cargo test --benches -- --list`): it has no scenarios to
//!   list; [`from_args`] exits at once, printing nothing.
//! - `--bench` (what `cargo bench` passes): [`Mode::Full`], the measurement as documented.
//! - neither (`cargo test --benches`, `cargo test --all-targets`): [`Mode::Smoke`], a run of a few
//!   seconds at tiny sizes that checks the machinery works and asserts on its outcome.

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A few seconds at tiny sizes, as `cargo test` runs a bench.
    Smoke,
    /// The whole measurement, as `cargo bench` runs it.
    Full,
}

/// The mode this process was started in; after `--list`, exits with success instead.
pub fn from_args() -> Mode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        std::process::exit(0);
    }
    if args.iter().any(|a| a == "--bench") {
        Mode::Full
    } else {
        Mode::Smoke
    }
}
