//! gpu-share's pure core: the decisions, as functions over plain data, with no Kubernetes
//! client, async runtime or HTTP. What a request asks ([`request`]), the policy ([`policy`]),
//! what a node holds ([`inventory`], [`mig`], [`nvidia`], [`dra`]), the packing ([`packing`])
//! and the ledger's model of who holds what ([`ledger`]), what holds a share to its budget
//! ([`enforcement`]), the reservation pods' model ([`reservation`]), the extender's cache
//! of nodes and pods ([`cache`]), and defragmentation's plan ([`defrag`]).
//!
//! The service (`gpu-share`: the webhook, the extender, the node agent, `gpu-share status`) and
//! the offline tools (the simulator, the benchmarks) are built on it; Cargo's dependency graph
//! keeps it free of I/O.
#![forbid(unsafe_code)]

pub mod cache;
pub mod defrag;
pub mod documents;
pub mod dra;
pub mod enforcement;
pub mod inventory;
pub mod ledger;
pub mod mig;
pub mod nvidia;
pub mod packing;
pub mod policy;
pub mod request;
pub mod reservation;
pub mod skew;
pub mod sync;
pub mod workloads;
