//! The pure parts: the recipe and its vectors, reference discovery, the stamp rules, patches,
//! workloads, the watcher's index, YAML 1.1, and the fuzz targets' regressions.

use confighash_testkit::build;

mod fuzz_regressions;
mod patch;
mod recipe_vectors;
mod refs;
mod rules;
mod workload;
mod yaml11;
