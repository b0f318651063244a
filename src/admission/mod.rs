//! The mutating admission webhook: a pure planner and the AdmissionReview wire layer.
pub mod plan;
pub mod review;
