//! Bind's decision, over the cache and without I/O: what to hold on the node, which reservation
//! to create first, what the binding carries ([`Decision::calls`]), and how the answers the API
//! can give settle the holding ([`Decision::settle`]). [`super::run`] has an
//! [`super::Executor`] carry the calls out in one go; the lifecycle property
//! (`tests/lifecycle_props.rs`) drives these same steps with the answers its cases choose.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::calls::{BindAnswers, BindCalls, Ended, ReservationCall};
use super::error::{BindError, HoldError};
use crate::cluster::reservation_api::CreateError;
use crate::extender::executor::Fill;
use crate::extender::state::ExtenderState;
use crate::extender::state::in_flight::{Binding, OnItsWay};
use crate::ledger;
use crate::packing;
use crate::shared::LoadedPolicy;

/// A reservation bind creates before the binding: a share in per-GPU form on a GPU that holds
/// no share yet. Its GPU is held for it (a stand-in) from before the create leaves.
pub struct Create<'a> {
    pub gpu: u32,
    /// Whether the reservation runs the GPU's MPS daemon (an MPS share).
    pub mps: bool,
    /// What the reservation's pod is made of (the policy's runtime class and CDI choice).
    pub template: crate::reservation::Template,
    hold: OnItsWay<'a>,
}

/// Bind's decision for one pod on one node, held in the cache: settle it with what the API
/// answers to its calls ([`Decision::settle`]). Dropped unsettled (the request cancelled
/// mid-call), its holding stays assumed until the assume TTL or the watch settles it.
pub struct Decision<'a> {
    binding: Binding<'a>,
    /// `namespace/name`.
    pub key: String,
    pub node: String,
    /// What the binding writes onto the pod: its GPUs and what holds its memory.
    pub annotations: BTreeMap<String, String>,
    /// The reservation to create before the binding, if any.
    pub create: Option<Create<'a>>,
}

/// Decides pod `pod`'s bind to `node` over the cache, and holds it there: re-checks the fit,
/// holds the demand (assumed until the watch shows the pod, where `asks_api`), and where the
/// share needs its GPU's reservation created, holds the GPU for it too. `asks_api` is false in
/// `--dev`, which creates no reservations and has no watch to wait for.
pub fn decide<'a>(
    ext: &'a ExtenderState,
    policy: &LoadedPolicy,
    reservations: &crate::reservation::Template,
    pod: &ledger::BindPod,
    node: &str,
    asks_api: bool,
) -> Result<Decision<'a>, HoldError> {
    let mut binding = ext.begin_bind(&pod.pod.uid, node, asks_api);
    // A moved pod's replacement takes the room its plan holds for it, where it is held.
    if let Some(steer) = ext.steer(pod).filter(|s| s.node == node) {
        binding = binding.redeeming(steer.promise);
    }
    let decided = |binding, annotations, create| Decision {
        binding,
        key: pod.key.clone(),
        node: node.to_string(),
        annotations,
        create,
    };
    let no_longer_fits = |reason| HoldError::NoLongerFits {
        node: node.to_string(),
        key: pod.key.clone(),
        reason,
    };
    let Some(mut demand) = pod.demand.clone()? else {
        // Nothing to account (the pod asks no GPU): bound as is.
        return Ok(decided(binding, BTreeMap::new(), None));
    };
    let requirement = policy.policy.enforcement.budgets;
    demand.enforcement = requirement;
    let scorer = ext.scorer(policy.policy.packing.policy.into());
    let pointed = demand.pointed();
    let mps = matches!(demand.gpu, packing::GpuDemand::Mps { .. });
    // A time-sliced reservation writes its GPU's CDI device where the policy says so, or where
    // the share takes it (admitted while the policy said so).
    let cdi_device = !mps && (policy.policy.per_gpu.timeslice_cdi || demand.takes_cdi_device());
    let (held_by, dra) = ext
        .ledger()
        .with_node(node, |nl| {
            (
                // What holds the share's memory there, said on the pod (not under `off`).
                (requirement != crate::enforcement::Requirement::Off)
                    .then(|| packing::memory_hold(&nl.node, &demand).annotation())
                    .flatten(),
                // On a DRA node the DRA plugin chose the devices (its claim is allocated before
                // bind): gpu-share chose the node only, and writes no per-GPU choice.
                nl.node.mode_source == crate::inventory::ModeSource::Dra,
            )
        })
        .unwrap_or_default();
    let placed = binding
        .hold(&scorer, pod.pod.clone(), demand)
        .map_err(no_longer_fits)?;
    let annotations = (!dra)
        .then(|| (ledger::ANNOTATION_GPUS.to_string(), placed.gpus_text()))
        .into_iter()
        .chain(held_by.map(|h| (crate::enforcement::ANNOTATION_HELD_BY.to_string(), h)))
        .collect();
    // The ledger now holds this share on the GPU, so no whole-GPU pod gets it while the
    // reservation starts; a bind racing this one meets it on AlreadyExists.
    let unreserved = placed.gpus.first().map(|(i, _)| *i).filter(|i| {
        pointed
            && ext
                .ledger()
                .with_node(node, |nl| {
                    nl.usage.reserved.get(*i as usize).is_none_or(|r| *r == 0)
                })
                .unwrap_or(false)
    });
    let Some(gpu) = unreserved.filter(|_| asks_api) else {
        return Ok(decided(binding, annotations, None));
    };
    let mut template = reservations.clone();
    template.runtime_class = policy.policy.runtime_class_name.clone();
    template.cdi_device = cdi_device;
    // Held for the reservation from before the create leaves: should this bind fail after it,
    // the reservation's pod exists, and its GPU must not look free until the watch shows it.
    match ext.begin_create(&scorer, node, gpu, mps, cdi_device) {
        Ok(hold) => Ok(decided(
            binding,
            annotations,
            Some(Create {
                gpu,
                mps,
                template,
                hold,
            }),
        )),
        Err(reason) => {
            binding.abort();
            Err(no_longer_fits(reason))
        }
    }
}

/// What the bind came to.
#[derive(Debug)]
pub enum Settled {
    /// Held: bound. Whether kube-scheduler retried it first (it was waiting for a release).
    Bound { retried_first: bool },
    /// Held in doubt: no answer to the binding nor to the read-back.
    InDoubt(BindError),
    /// Released: not bound.
    Failed(BindError),
}

impl Decision<'_> {
    /// The calls that carry the decision out, for pod `namespace/name` (`uid`): the reservation
    /// to create first, if any, then the binding with its annotations.
    pub fn calls(&self, namespace: &str, name: &str, uid: &str) -> BindCalls {
        BindCalls {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            node: self.node.clone(),
            annotations: self.annotations.clone(),
            reservation: self.create.as_ref().map(|c| ReservationCall {
                gpu: c.gpu,
                mps: c.mps,
                template: c.template.clone(),
            }),
        }
    }

    /// Settles the decision by the API's answers: the reservation's stand-in kept while its pod
    /// may exist, a create that failed failing the bind (its holding released), and the holding
    /// settled by how the binding ended ([`Decision::settle_binding`]).
    pub fn settle(mut self, answers: BindAnswers) -> Settled {
        match answers {
            BindAnswers::NotCreated { gpu, error } => {
                self.created(Err(&error));
                let e = BindError::Reservation {
                    key: self.key.clone(),
                    node: self.node.clone(),
                    gpu,
                    source: error,
                };
                self.abort();
                Settled::Failed(e)
            }
            BindAnswers::Tried { created, ended } => {
                if let Some(pod) = &created {
                    self.created(Ok(&**pod));
                }
                self.settle_binding(ended)
            }
        }
    }

    /// Settles the reservation's stand-in by how its create ended: kept while the pod may exist.
    fn created(&mut self, created: Result<&Option<Pod>, &CreateError>) {
        if let Some(create) = self.create.take() {
            create.hold.settle(created);
        }
    }

    /// Gives up without an answer (the caller goes away): releases the holding.
    pub fn abort(self) {
        self.binding.abort();
    }

    /// Settles the holding by how the binding call ended: kept where the API has the pod on
    /// this node, released where it surely has not, and held in doubt where nobody answered.
    fn settle_binding(self, ended: Ended) -> Settled {
        let Decision {
            binding, key, node, ..
        } = self;
        match ended {
            Ended::Bound => Settled::Bound {
                retried_first: binding.commit(),
            },
            Ended::Failed {
                why,
                read: Some(Ok(Some(bound))),
            } if bound == node => {
                tracing::warn!(pod = %key, node = %node, error = %why, "the binding call failed but the pod is bound there: kept");
                Settled::Bound {
                    retried_first: binding.commit(),
                }
            }
            Ended::Failed {
                why,
                read: Some(Err(read)),
            } => {
                binding.doubt();
                Settled::InDoubt(BindError::Unsettled {
                    key,
                    node,
                    source: why,
                    read: Box::new(read),
                })
            }
            Ended::Failed { why, .. } => {
                binding.abort();
                Settled::Failed(BindError::Failed {
                    key,
                    node,
                    source: why,
                })
            }
        }
    }
}

/// A share in per-GPU form bound to a GPU whose reservation has published its UUID gets its
/// devices ConfigMap at once, so kubelet starts its container without waiting for the
/// reservation controller's next tick. The controller fills whatever this does not (a share
/// whose reservation is still starting, a create that failed), and handles a ConfigMap of that
/// name that is not this one.
pub fn fill(ext: &ExtenderState, uid: &str) -> Option<Fill> {
    let h = ext.ledger().holding(uid)?;
    let (Some(devices), [(gpu, _)]) = (h.demand.devices, h.placement.gpus.as_slice()) else {
        return None;
    };
    let reservation = ext.reservations.ready(&h.node, *gpu)?;
    let uuid = reservation.state.uuid()?.to_string();
    let gpu_memory = ext
        .ledger()
        .with_node(&h.node, |nl| nl.node.gpu_memory_mib)
        .flatten();
    // What does not match (a share of the other class, an MPS share with no limit to give, a
    // share that takes a CDI device its reservation did not write) is the controller's to
    // handle, in words.
    let kind = crate::reservation::plan::ShareKind::of(&h.demand.gpu, &devices, gpu_memory);
    let through = kind
        .through(&reservation.at(std::time::SystemTime::now()))
        .ok()?;
    Some(Fill {
        configmap: devices.configmap,
        owner: crate::reservation::view::Owner {
            namespace: h.pod.namespace,
            name: h.pod.name,
            uid: h.pod.uid,
        },
        to: crate::reservation::view::Pointing { uuid, through },
        reservation: reservation.name,
    })
}
