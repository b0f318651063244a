//! The mutating admission webhook: a pure planner for pod CREATEs, a pure rule for UPDATEs of
//! gpu-share's annotations, and the AdmissionReview wire layer.
mod affinity;
pub mod guard;
pub mod plan;
pub mod review;
