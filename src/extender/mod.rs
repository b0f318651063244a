//! The kube-scheduler extender: wire types, live state and the four verbs.

pub mod config;
pub mod handlers;
pub mod state;
pub mod wire;
