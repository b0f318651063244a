//! The kube-scheduler extender: wire types, live state and the four verbs.

pub mod bind;
pub mod config;
pub mod handlers;
pub mod report;
pub mod state;
pub mod wire;
