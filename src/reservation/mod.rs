//! Reservations: on a node gpu-share shares per GPU, a pod that holds each shared GPU through
//! NVIDIA's device plugin and tells gpu-share which GPU it is. The model is pure
//! ([`model`]); `gpu-share reserve`, the reservation's own process, is the node agent
//! (`gpu_share_agent`, crates/agent). What the service plans for each shared GPU is [`plan`],
//! what it reads of the reservations and the devices ConfigMaps [`view`].
pub mod plan;
pub mod view;

/// The model: the pure core's (crates/core).
pub use gpu_share_core::reservation as model;

pub use model::*;
