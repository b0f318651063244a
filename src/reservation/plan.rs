//! PURE: what the reservation controller does for each shared GPU, from what the API shows of it
//! (its reservation, the shares bound to it and their ConfigMaps) and the time.
//!
//! - A reservation that knows its GPU's UUID fills the ConfigMap of every share that has none
//!   yet: kubelet then starts the share's container, on that GPU.
//! - A share whose ConfigMap names another GPU (its reservation was replaced and the device
//!   plugin gave the new one another GPU) is evicted: it may be running on a GPU no reservation
//!   holds any more.
//! - A reservation that fails (NVML, a GPU the plugin gave another pod first, an image that
//!   cannot pull), or that does not start within [`START_TIMEOUT`], moves the shares that have
//!   not started to another GPU, evicts those that have, and is deleted.
//! - A reservation that is gone (deleted by hand) while shares are bound to its GPU is
//!   created again.
//! - A reservation with no share left is released after the policy's grace.

use std::time::Duration;

/// How long a reservation may take to publish its GPU's UUID before it counts as failed: an
/// image pull on a fresh node, well within; a pull that cannot succeed, or a kubelet that
/// refused the pod, is failure.
pub const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A reservation as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub name: String,
    /// Its pod's UID: a reservation deleted is this pod, not a later one of the same name.
    pub uid: String,
    /// It runs its GPU's MPS daemon.
    pub mps: bool,
    /// It writes its GPU's CDI device `gpu-share.io/gpu=<UUID>` (time-sliced, the policy's
    /// `perGpu.timesliceCdi` when it was created).
    pub cdi_device: bool,
    pub state: ReservationState,
    /// Since it was created.
    pub age: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReservationState {
    /// Created; its UUID not published yet. `waiting`: why its container has not started, as
    /// kubelet says (e.g. `ImagePullBackOff: ...`), if it says.
    Starting { waiting: Option<String> },
    /// Holds the GPU with this UUID.
    Ready { uuid: String },
    /// Cannot hold a GPU: why, in words (its own annotation, or the pod's status).
    Failed { why: String },
    /// Being deleted (by gpu-share, or by hand): nothing is pointed at it; once it is gone, a
    /// GPU that still has shares gets a new one.
    Leaving,
}

impl ReservationState {
    /// One word for it: `starting`, `ready`, `failed` or `leaving`.
    pub fn word(&self) -> &'static str {
        match self {
            ReservationState::Starting { .. } => "starting",
            ReservationState::Ready { .. } => "ready",
            ReservationState::Failed { .. } => "failed",
            ReservationState::Leaving => "leaving",
        }
    }

    /// The UUID it holds, when ready.
    pub fn uuid(&self) -> Option<&str> {
        match self {
            ReservationState::Ready { uuid } => Some(uuid),
            _ => None,
        }
    }

    /// Why it failed, or why its container waits, in words.
    pub fn detail(&self) -> Option<&str> {
        match self {
            ReservationState::Failed { why } => Some(why),
            ReservationState::Starting { waiting } => waiting.as_deref(),
            _ => None,
        }
    }
}

/// A share bound to the GPU (a pod in per-GPU form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The ConfigMap its container reads the GPU from ([`crate::packing::Demand::devices`]).
    pub configmap: String,
    /// Time-sliced, or an MPS client of the GPU's daemon.
    pub kind: ShareKind,
    /// The UUID its ConfigMap holds, when it exists (its container may have started on it).
    pub filled: Option<String>,
}

/// What a share is to its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareKind {
    /// Time-sliced; with `cdi_device`, it takes its GPU's CDI device `gpu-share.io/gpu=<UUID>`
    /// (only a reservation that wrote it can serve it), else the bare UUID.
    Timeslice { cdi_device: bool },
    /// An MPS client, with its pinned device-memory limit: its budget, else its fraction of the
    /// GPU's memory (`None`: it has no budget and the node's GPU memory is unknown).
    Mps { pinned_mib: Option<u64> },
}

impl ShareKind {
    pub fn is_mps(self) -> bool {
        matches!(self, ShareKind::Mps { .. })
    }

    /// The kind of a share in per-GPU form that asks `gpu` and reads `devices`, on GPUs of
    /// `gpu_memory_mib` each: an MPS share's pinned limit is its budget, else its thousandths of
    /// the GPU's memory (the same fraction as its threads), rounded down.
    pub fn of(
        gpu: &crate::packing::GpuDemand,
        devices: &crate::packing::Devices,
        gpu_memory_mib: Option<u64>,
    ) -> ShareKind {
        match gpu {
            crate::packing::GpuDemand::Mps { milli, memory_mib } => ShareKind::Mps {
                pinned_mib: crate::packing::per_gpu_mps_memory(*milli, *memory_mib, gpu_memory_mib),
            },
            _ => ShareKind::Timeslice {
                cdi_device: devices.cdi_device,
            },
        }
    }

    /// What a share of this kind is pointed through on a GPU whose reservation is `r`, or why it
    /// cannot be.
    pub fn through(self, r: &Reservation) -> Result<Through, Unserved> {
        let reservation = r.name.clone();
        match self {
            ShareKind::Mps { .. } if !r.mps => Err(Unserved::NoDaemon { reservation }),
            ShareKind::Timeslice { .. } if r.mps => Err(Unserved::ForMps { reservation }),
            ShareKind::Timeslice { cdi_device: true } if !r.cdi_device => {
                Err(Unserved::NoCdiDevice { reservation })
            }
            ShareKind::Timeslice { cdi_device } => Ok(if cdi_device {
                Through::GpuDevice
            } else {
                Through::Uuid
            }),
            ShareKind::Mps { pinned_mib: None } => Err(Unserved::NoPinnedLimit),
            ShareKind::Mps {
                pinned_mib: Some(pinned_mib),
            } => Ok(Through::MpsDevice { pinned_mib }),
        }
    }
}

/// Why a GPU's reservation cannot serve a share, in words (after "GPU i of node n").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unserved {
    #[error(
        "is held by reservation {reservation}, which runs no MPS daemon, and the pod is an MPS share"
    )]
    NoDaemon { reservation: String },
    #[error(
        "is held by reservation {reservation} for MPS shares (its GPU takes no other process), and the pod is time-sliced"
    )]
    ForMps { reservation: String },
    #[error(
        "is held by reservation {reservation}, which wrote no CDI device {kind}=<UUID> (it was created while the policy's perGpu.timesliceCdi was off), and the pod takes its GPU through that device",
        kind = super::model::GPU_CDI_KIND
    )]
    NoCdiDevice { reservation: String },
    #[error(
        "cannot serve the pod, an MPS share without gpu-share/memory: the node's GPU memory is unknown (no nvidia.com/gpu.memory label), so the pod has no pinned-memory limit to be given: set gpu-share/memory"
    )]
    NoPinnedLimit,
}

/// One shared GPU of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub node: String,
    pub index: u32,
    /// Its shares are MPS clients, or its reservation runs an MPS daemon.
    pub mps: bool,
    pub reservation: Option<Reservation>,
    pub shares: Vec<Share>,
    /// How long the GPU has had no share (`None`: shares are on it, or it is not known when
    /// the last one left, which counts from now).
    pub idle_for: Option<Duration>,
}

/// What a share's devices ConfigMap points it at: its GPU, and what names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointing {
    pub uuid: String,
    pub through: Through,
}

/// What names the GPU to a share's container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Through {
    /// The bare UUID, read by the Container Toolkit's legacy runtime.
    Uuid,
    /// The CDI device its time-sliced reservation wrote, `gpu-share.io/gpu=<UUID>`: the GPU
    /// as NVIDIA's CDI spec on the node describes it, NVIDIA's hooks included.
    GpuDevice,
    /// The CDI device its MPS reservation wrote, `gpu-share.io/mps=<UUID>` (the GPU, the
    /// daemon's pipe and its `/dev/shm`), with the client's pinned device-memory limit (its
    /// budget, or its fraction of the GPU's memory).
    MpsDevice { pinned_mib: u64 },
}

impl Pointing {
    /// What the share's key holds: the GPU's UUID, or the fully qualified name of the CDI
    /// device the GPU's reservation wrote.
    pub fn devices(&self) -> String {
        match self.through {
            Through::Uuid => self.uuid.clone(),
            Through::GpuDevice => format!("{}={}", super::model::GPU_CDI_KIND, self.uuid),
            Through::MpsDevice { .. } => format!("{}={}", super::model::MPS_CDI_KIND, self.uuid),
        }
    }

    /// The ConfigMap key the share's container reads it from.
    pub fn key(&self) -> &'static str {
        match self.through {
            Through::GpuDevice => crate::request::CDI_DEVICE_KEY,
            _ => crate::request::DEVICES_KEY,
        }
    }
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create the share's ConfigMap pointing it at the GPU (owned by the pod; immutable).
    Fill { share: Share, to: Pointing },
    /// Delete the reservation: released, or `failed`.
    Delete {
        reservation: String,
        uid: String,
        why: String,
        failed: bool,
    },
    /// Create the GPU's reservation again (with its MPS daemon when `mps`).
    Recreate { node: String, gpu: u32, mps: bool },
    /// Move a share that has not started to another GPU of its node (or evict it if none has
    /// room).
    Move { share: Share, why: String },
    /// Evict the share (delete the pod), with an event in words.
    Evict { share: Share, why: String },
}

/// The actions for one GPU, given the release grace.
pub fn plan(gpu: &Gpu, grace: Duration) -> Vec<Action> {
    let mut out = Vec::new();
    let at = format!("GPU {} of node {}", gpu.index, gpu.node);
    match &gpu.reservation {
        None if !gpu.shares.is_empty() => out.push(Action::Recreate {
            node: gpu.node.clone(),
            gpu: gpu.index,
            mps: gpu.mps,
        }),
        None => {}
        Some(r) => {
            let failed = match &r.state {
                ReservationState::Failed { why } => Some(why.clone()),
                ReservationState::Starting { waiting } if r.age >= START_TIMEOUT => Some(format!(
                    "its reservation {} did not hold the GPU within {} s ({})",
                    r.name,
                    START_TIMEOUT.as_secs(),
                    waiting.as_deref().unwrap_or(
                        "an image that cannot pull, or the device plugin had no GPU left for it"
                    )
                )),
                _ => None,
            };
            if let Some(why) = failed {
                let why = format!("{at} cannot be held: {why}");
                for s in &gpu.shares {
                    out.push(if s.filled.is_some() {
                        Action::Evict {
                            share: s.clone(),
                            why: why.clone(),
                        }
                    } else {
                        Action::Move {
                            share: s.clone(),
                            why: why.clone(),
                        }
                    });
                }
                out.push(Action::Delete {
                    reservation: r.name.clone(),
                    uid: r.uid.clone(),
                    why,
                    failed: true,
                });
            } else if let ReservationState::Ready { uuid } = &r.state {
                for s in &gpu.shares {
                    match (&s.filled, s.kind.through(r)) {
                        (None, Err(why)) => out.push(Action::Evict {
                            share: s.clone(),
                            why: format!("{at} {why}"),
                        }),
                        (None, Ok(through)) => out.push(Action::Fill {
                            share: s.clone(),
                            to: Pointing {
                                uuid: uuid.clone(),
                                through,
                            },
                        }),
                        (Some(u), _) if u != uuid => out.push(Action::Evict {
                            share: s.clone(),
                            why: format!(
                                "{at} is now {uuid}, held by reservation {}; the pod was pointed at {u}, which gpu-share no longer holds",
                                r.name
                            ),
                        }),
                        (Some(_), _) => {}
                    }
                }
                if gpu.shares.is_empty() && gpu.idle_for.is_some_and(|d| d >= grace) {
                    out.push(Action::Delete {
                        reservation: r.name.clone(),
                        uid: r.uid.clone(),
                        why: format!("released: no share on {at} for {} s", grace.as_secs()),
                        failed: false,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(name: &str, filled: Option<&str>) -> Share {
        Share {
            namespace: "ml".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            configmap: format!("gpu-share-devices-{name}"),
            kind: ShareKind::Timeslice { cdi_device: false },
            filled: filled.map(str::to_string),
        }
    }

    fn to(uuid: &str, mps_pinned_mib: Option<u64>) -> Pointing {
        Pointing {
            uuid: uuid.into(),
            through: match mps_pinned_mib {
                Some(pinned_mib) => Through::MpsDevice { pinned_mib },
                None => Through::Uuid,
            },
        }
    }

    fn gpu(state: Option<ReservationState>, shares: Vec<Share>) -> Gpu {
        Gpu {
            node: "n1".into(),
            index: 2,
            mps: false,
            reservation: state.map(|state| Reservation {
                name: "gpu-share-n1-gpu-2".into(),
                uid: "r-uid".into(),
                mps: false,
                cdi_device: false,
                state,
                age: Duration::from_secs(5),
            }),
            shares,
            idle_for: None,
        }
    }

    const GRACE: Duration = Duration::from_secs(30);
    const U: &str = "GPU-aaaa";

    fn ready() -> Option<ReservationState> {
        Some(ReservationState::Ready { uuid: U.into() })
    }

    #[test]
    fn a_ready_reservation_fills_the_configmaps_that_are_missing() {
        let g = gpu(ready(), vec![share("a", None), share("b", Some(U))]);
        assert_eq!(
            plan(&g, GRACE),
            vec![Action::Fill {
                share: share("a", None),
                to: to(U, None)
            }]
        );
        // Starting: the shares wait (their containers do not start without the key).
        assert!(
            plan(
                &gpu(
                    Some(ReservationState::Starting { waiting: None }),
                    vec![share("a", None)]
                ),
                GRACE
            )
            .is_empty()
        );
    }

    #[test]
    fn an_mps_shares_pinned_limit_is_its_budget_else_its_fraction_of_the_gpu() {
        use crate::packing::{Devices, GpuDemand};
        let devices = |cdi_device| Devices {
            configmap: "gpu-share-devices-x".into(),
            cdi_device,
        };
        let plain = devices(false);
        let mps = |memory_mib| GpuDemand::Mps {
            milli: 250,
            memory_mib,
        };
        assert_eq!(
            ShareKind::of(&mps(Some(20480)), &plain, Some(81920)),
            ShareKind::Mps {
                pinned_mib: Some(20480)
            }
        );
        assert_eq!(
            ShareKind::of(&mps(None), &plain, Some(81920)),
            ShareKind::Mps {
                pinned_mib: Some(20480)
            }
        );
        assert_eq!(
            ShareKind::of(&mps(None), &plain, None),
            ShareKind::Mps { pinned_mib: None }
        );
        let ts = GpuDemand::Timeslice {
            milli: 250,
            memory_mib: None,
        };
        assert_eq!(
            ShareKind::of(&ts, &plain, Some(81920)),
            ShareKind::Timeslice { cdi_device: false }
        );
        assert_eq!(
            ShareKind::of(&ts, &devices(true), Some(81920)),
            ShareKind::Timeslice { cdi_device: true }
        );
    }

    /// An MPS reservation points its MPS shares at its daemon's CDI device, with their pinned
    /// limits; a share of the other class, or one with no limit to give, is evicted in words;
    /// a vanished MPS reservation comes back with its daemon.
    #[test]
    fn mps_shares_get_their_daemon_and_limit_and_never_a_gpu_of_the_other_class() {
        let mps = |name: &str, pinned_mib| Share {
            kind: ShareKind::Mps { pinned_mib },
            ..share(name, None)
        };
        let mut g = gpu(
            ready(),
            vec![mps("a", Some(20480)), mps("b", None), share("ts", None)],
        );
        g.mps = true;
        g.reservation.as_mut().unwrap().mps = true;
        let actions = plan(&g, GRACE);
        assert_eq!(
            actions[0],
            Action::Fill {
                share: mps("a", Some(20480)),
                to: to(U, Some(20480))
            }
        );
        let [
            _,
            Action::Evict { why: no_limit, .. },
            Action::Evict { why: plain, .. },
        ] = actions.as_slice()
        else {
            panic!("{actions:?}")
        };
        assert!(no_limit.contains("set gpu-share/memory"), "{no_limit}");
        assert!(plain.contains("for MPS shares"), "{plain}");
        // A reservation without a daemon takes no MPS share.
        g.reservation.as_mut().unwrap().mps = false;
        let actions = plan(&g, GRACE);
        assert!(
            matches!(&actions[0], Action::Evict { why, .. } if why.contains("runs no MPS daemon")),
            "{actions:?}"
        );
        g.reservation = None;
        assert!(matches!(
            plan(&g, GRACE).as_slice(),
            [Action::Recreate { mps: true, .. }]
        ));
    }

    /// A reservation that wrote its GPU's CDI device points a share that takes it at the device,
    /// and one admitted for the bare UUID at the UUID; a reservation that wrote none cannot
    /// serve a share that takes the device (it would never start), and says so.
    #[test]
    fn a_share_that_takes_the_gpus_cdi_device_gets_it_only_from_a_reservation_that_wrote_it() {
        let cdi = |name: &str| Share {
            kind: ShareKind::Timeslice { cdi_device: true },
            ..share(name, None)
        };
        let mut g = gpu(ready(), vec![cdi("c"), share("u", None)]);
        g.reservation.as_mut().unwrap().cdi_device = true;
        let through = |p: &Pointing| (p.through, p.devices(), p.key());
        let actions = plan(&g, GRACE);
        let [Action::Fill { to: c, .. }, Action::Fill { to: u, .. }] = actions.as_slice() else {
            panic!("{actions:?}")
        };
        assert_eq!(
            through(c),
            (
                Through::GpuDevice,
                format!("gpu-share.io/gpu={U}"),
                crate::request::CDI_DEVICE_KEY
            )
        );
        assert_eq!(
            through(u),
            (Through::Uuid, U.to_string(), crate::request::DEVICES_KEY)
        );
        g.reservation.as_mut().unwrap().cdi_device = false;
        let actions = plan(&g, GRACE);
        let [
            Action::Evict { share: s, why },
            Action::Fill { share: f, .. },
        ] = actions.as_slice()
        else {
            panic!("{actions:?}")
        };
        assert_eq!((s.name.as_str(), f.name.as_str()), ("c", "u"));
        assert!(
            why.contains("wrote no CDI device gpu-share.io/gpu=<UUID>")
                && why.contains("perGpu.timesliceCdi")
                && why.starts_with("GPU 2 of node n1 is held by"),
            "{why}"
        );
    }

    #[test]
    fn a_share_pointed_at_another_gpu_is_evicted_in_words() {
        let g = gpu(ready(), vec![share("old", Some("GPU-bbbb"))]);
        let actions = plan(&g, GRACE);
        let [Action::Evict { share: s, why }] = actions.as_slice() else {
            panic!("{actions:?}")
        };
        assert_eq!(s.name, "old");
        assert!(
            why.contains("GPU-bbbb") && why.contains(U) && why.contains("GPU 2 of node n1"),
            "{why}"
        );
    }

    #[test]
    fn a_failed_or_stuck_reservation_moves_waiting_shares_evicts_started_ones_and_goes() {
        for state in [
            ReservationState::Failed {
                why: "NVML failed: driver not loaded".into(),
            },
            ReservationState::Starting { waiting: None },
        ] {
            let mut g = gpu(
                Some(state.clone()),
                vec![share("waiting", None), share("running", Some(U))],
            );
            g.reservation.as_mut().unwrap().age = START_TIMEOUT;
            let actions = plan(&g, GRACE);
            assert_eq!(actions.len(), 3, "{actions:?}");
            let Action::Move { share: m, why } = &actions[0] else {
                panic!("{actions:?}")
            };
            assert_eq!(m.name, "waiting");
            let expected = if matches!(state, ReservationState::Starting { .. }) {
                "did not hold the GPU within 120 s"
            } else {
                "NVML failed: driver not loaded"
            };
            assert!(
                why.contains(expected) && why.contains("GPU 2 of node n1"),
                "{why}"
            );
            assert!(matches!(&actions[1], Action::Evict { share, .. } if share.name == "running"));
            assert!(
                matches!(&actions[2], Action::Delete { reservation, failed: true, .. } if reservation == "gpu-share-n1-gpu-2")
            );
        }
        // A reservation still starting within the timeout is waited for.
        let g = gpu(
            Some(ReservationState::Starting { waiting: None }),
            vec![share("a", None)],
        );
        assert!(plan(&g, GRACE).is_empty());
    }

    #[test]
    fn a_vanished_reservation_is_created_again_while_shares_need_it() {
        let g = gpu(None, vec![share("a", Some(U))]);
        assert_eq!(
            plan(&g, GRACE),
            vec![Action::Recreate {
                node: "n1".into(),
                gpu: 2,
                mps: false
            }]
        );
        assert!(plan(&gpu(None, vec![]), GRACE).is_empty());
        // One being deleted is waited for: nothing is filled from it, nothing created yet.
        let mut g = gpu(Some(ReservationState::Leaving), vec![share("a", None)]);
        g.reservation.as_mut().unwrap().age = START_TIMEOUT * 2;
        assert!(plan(&g, GRACE).is_empty());
    }

    #[test]
    fn an_idle_reservation_is_released_after_the_grace_only() {
        let mut g = gpu(ready(), vec![]);
        assert!(
            plan(&g, GRACE).is_empty(),
            "idle since unknown: counts from now"
        );
        g.idle_for = Some(GRACE - Duration::from_secs(1));
        assert!(plan(&g, GRACE).is_empty());
        g.idle_for = Some(GRACE);
        let actions = plan(&g, GRACE);
        let [
            Action::Delete {
                why, failed: false, ..
            },
        ] = actions.as_slice()
        else {
            panic!("{actions:?}")
        };
        assert!(why.starts_with("released"), "{why}");
    }
}
