//! gpu-share's node agent: `gpu-share reserve`, the process of a reservation pod. On a node
//! gpu-share shares per GPU, each shared GPU is held by such a pod through NVIDIA's device plugin;
//! the agent finds which GPU that is (NVML), writes its UUID onto the pod, writes the GPU's CDI
//! device ([`cdi`]), runs its MPS control daemon where its shares are MPS clients ([`mps`]), and
//! holds it until stopped ([`agent`]).
//!
//! The service creates these pods and reads what they publish; the two share only the
//! reservation's model, in the core ([`model`]).
#![forbid(unsafe_code)]

pub mod agent;
pub mod cdi;
pub mod mps;
mod signal;

/// The reservation's model: the pure core's (crates/core).
pub use gpu_share_core::reservation as model;

pub use agent::{ReserveArgs, run};
