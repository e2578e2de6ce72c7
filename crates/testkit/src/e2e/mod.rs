//! The end-to-end scenarios' environment: the stand-in or a real cluster ([`support`]), faults a
//! real control plane makes ([`real`]), and the fault run's real-cluster mode ([`real_fault_run`]).

pub mod fault_run;
pub mod kinds;
pub mod real;
pub mod support;
