//! The naive reference for MoE dispatch/combine, shared by tests/moe.rs
//! (ranks as threads), tests/moe_schedules.rs and ferrocoll-cli's
//! tests/moe_processes.rs (ranks as processes): the library's
//! `ferrocoll::moe::reference`, which `ferrocoll bench moe --check` uses
//! too.

#![allow(unused_imports)] // each test crate uses its own subset

pub use ferrocoll::moe::reference::*;
