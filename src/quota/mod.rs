//! Quotas that count fractions. Every gpu-share pod carries [`crate::request::RESOURCE_GPU_MILLI`],
//! its size in thousandths of a GPU (the webhook adds it: [`crate::request::GpuRequest::gpu_milli`]),
//! so that ResourceQuota and Kueue count GPUs as fractions with no tool of gpu-share's. This room
//! holds the rest:
//! - [`advertise`] (pure): what each GPU node advertises of the quantity, so that no pod carrying
//!   it waits on kube-scheduler's node events in vain, and kubelet admits it by a true bound;
//! - [`advertiser`]: the leading replica's loop that patches node status to match;
//! - [`usage`] (pure): each namespace's use against its quotas, in GPUs, for `gpu-share status`
//!   and the occupancy page;
//! - [`report`]: the same from the extender's live state, and `GET /v1/quotas`.

pub mod advertise;
pub mod advertiser;
pub mod report;
pub mod usage;
