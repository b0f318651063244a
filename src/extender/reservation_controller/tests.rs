//! The reservation controller's gathering, decisions and calls, against an executor that
//! answers as told: what the ledger holds after each answer, and what is said.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Pod;

use super::gather::{gather, has_shares};
use super::{Decided, Step, carry_out, decide, execute};
use crate::cluster::reservation_api::{self as api, CreateError};
use crate::extender::executor::{Executor, Fill};
use crate::extender::state::{ExtenderState, LedgerView, Mode};
use crate::ledger::{Holder, Ledger};
use crate::metrics::Metrics;
use crate::reservation::Template;
use crate::reservation::plan::{self, Action, ReservationState};
use crate::reservation::view::{Filled, FilledByOwner, Owner, ReservationPod};
use crate::shared::{LoadedPolicy, PolicyStore};

use crate::inventory::{GpuNode, Sharing};
use crate::ledger::{ObservedPod, PodRef};
use crate::packing::{Demand, GpuDemand};

fn per_gpu_node() -> GpuNode {
    let mut n = GpuNode::whole("n1", "NVIDIA-A100-SXM4-80GB", 4, 81920);
    n.sharing = Sharing::PerGpu;
    n
}

fn share(uid: &str, gpu: u32, milli: u32) -> ObservedPod {
    ObservedPod {
        pod: PodRef::new(uid, "ml", format!("p-{uid}")),
        node: "n1".into(),
        demand: Demand {
            devices: Some(crate::packing::Devices {
                configmap: format!("gpu-share-devices-{uid}"),
                cdi_device: false,
            }),
            enforcement: crate::enforcement::Requirement::Off,
            driver_limit_mib: None,
            ..Demand::gpu(GpuDemand::Timeslice {
                milli,
                memory_mib: None,
            })
        },
        gpus: Some(vec![(gpu, milli)]),
    }
}

fn reservation(gpu: u32, state: ReservationState) -> ReservationPod {
    ReservationPod {
        name: crate::reservation::name("n1", gpu),
        uid: format!("r-{gpu}"),
        node: "n1".into(),
        gpu,
        mps: false,
        cdi_device: false,
        state,
        created: Some(SystemTime::now()),
    }
}

/// Shares and reservations meet per GPU; a share's ConfigMap counts only when it is the one
/// its container reads, owned by it; idle time counts from the first idle tick.
#[test]
fn gather_meets_shares_and_reservations_per_gpu() {
    let ledger = Ledger::new();
    ledger.upsert_node(per_gpu_node());
    ledger.record(&share("a", 0, 300));
    ledger.record(&share("b", 0, 300));
    ledger.record(&share("c", 2, 500));
    let ready = |u: &str| ReservationState::Ready { uuid: u.into() };
    let pods = vec![
        reservation(0, ready("GPU-0")),
        reservation(1, ready("GPU-1")),
    ];
    let mut filled = FilledByOwner::new();
    let f = |uid: &str, name: &str| Filled {
        namespace: "ml".into(),
        name: name.into(),
        owner_uid: uid.into(),
        uuid: "GPU-0".into(),
        through: crate::reservation::view::Through::Uuid,
    };
    filled.insert("a".into(), f("a", "gpu-share-devices-a"));
    filled.insert("b".into(), f("b", "some-other-configmap"));
    let mut idle = HashMap::new();
    let t0 = Instant::now();
    let gpus = gather(LedgerView::new(&ledger), &pods, &filled, &mut idle, t0);
    assert_eq!(
        gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let g0 = &gpus[0];
    assert_eq!(g0.shares.len(), 2);
    let filled_of = |uid: &str| {
        g0.shares
            .iter()
            .find(|s| s.uid == uid)
            .unwrap()
            .filled
            .clone()
    };
    assert_eq!(filled_of("a").as_deref(), Some("GPU-0"));
    assert_eq!(
        filled_of("b"),
        None,
        "not the ConfigMap its container reads"
    );
    assert_eq!(g0.idle_for, None);
    assert_eq!(gpus[1].idle_for, Some(Duration::ZERO));
    assert!(gpus[2].reservation.is_none() && gpus[2].shares.len() == 1);
    // A later tick: idle since the first.
    let gpus = gather(
        LedgerView::new(&ledger),
        &pods,
        &filled,
        &mut idle,
        t0 + Duration::from_secs(31),
    );
    assert_eq!(gpus[1].idle_for, Some(Duration::from_secs(31)));
    assert_eq!(
        plan::plan(&gpus[1], Duration::from_secs(30)).len(),
        1,
        "released after the grace"
    );
    // A share arriving resets it.
    ledger.record(&share("d", 1, 100));
    let gpus = gather(
        LedgerView::new(&ledger),
        &pods,
        &filled,
        &mut idle,
        t0 + Duration::from_secs(32),
    );
    assert_eq!(gpus[1].idle_for, None);
    assert!(idle.is_empty());
}

/// A share moves only to one of the GPUs it is offered that has room for it, chosen by the
/// packing (binpack: the fuller), and the ledger follows.
#[test]
fn a_share_is_repointed_only_where_it_fits() {
    let ledger = Ledger::new();
    ledger.upsert_node(per_gpu_node());
    ledger.record(&share("a", 0, 600));
    ledger.record(&share("b", 1, 500));
    ledger.record(&share("c", 3, 300));
    let scorer = crate::packing::Scorer::new(crate::packing::PackingPolicy::Binpack);
    assert_eq!(ledger.repoint(&scorer, "a", &[1]), None, "600 + 500 > 1000");
    assert_eq!(ledger.repoint(&scorer, "a", &[]), None, "nothing offered");
    assert_eq!(ledger.repoint(&scorer, "a", &[9]), None, "no such GPU");
    assert_eq!(
        ledger.repoint(&scorer, "a", &[1, 2, 3]),
        Some(vec![(3, 600)]),
        "GPU 3 (300 used) before the empty GPU 2; GPU 1 has no room"
    );
    ledger
        .with_node("n1", |nl| {
            assert_eq!(nl.usage.gpu_milli[0], 0);
            assert_eq!(nl.usage.gpu_milli[3], 900);
            assert!(nl.within_capacity());
        })
        .unwrap();
    assert!(
        has_shares(LedgerView::new(&ledger), "n1", 3)
            && !has_shares(LedgerView::new(&ledger), "n1", 0)
    );
    // Put back (a failed patch): the ledger follows the API again.
    assert_eq!(ledger.repoint(&scorer, "a", &[0]), Some(vec![(0, 600)]));
    assert!(
        has_shares(LedgerView::new(&ledger), "n1", 0)
            && !has_shares(LedgerView::new(&ledger), "n1", 2)
    );
    ledger
        .with_node("n1", |nl| assert_eq!(nl.usage.gpu_milli[3], 300))
        .unwrap();
}

/// How the fake API answers every call.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Answer {
    Accepted,
    /// An HTTP status: 4xx refuses (nothing done), 5xx may have done it.
    Status(u16),
    /// No answer in time.
    Unanswered,
}

/// An executor that records each call, in words, and answers as told.
#[derive(Clone)]
struct Fake {
    calls: Arc<Mutex<Vec<String>>>,
    answer: Answer,
    /// What a fill finds.
    fill: api::Fill,
}

impl Fake {
    fn answering(answer: Answer) -> Self {
        Fake {
            calls: Arc::default(),
            answer,
            fill: api::Fill::Done,
        }
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn call(&self, what: String) -> Result<(), kube::Error> {
        self.calls.lock().unwrap().push(what);
        match self.answer {
            Answer::Accepted => Ok(()),
            Answer::Status(code) => Err(kube::Error::Api(
                kube::core::Status::failure("refused", "")
                    .with_code(code)
                    .boxed(),
            )),
            Answer::Unanswered => Err(kube::Error::Api(
                kube::core::Status::failure("timed out", "")
                    .with_code(504)
                    .boxed(),
            )),
        }
    }
}

impl Executor for Fake {
    const ASKS_API: bool = true;

    async fn get_pod(&self, _: &str, _: &str) -> Result<Pod, crate::extender::bind::ReadBackError> {
        unreachable!("the controller reads no pod")
    }

    async fn bind_pod(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &str,
        _: std::collections::BTreeMap<String, String>,
    ) -> Result<(), crate::extender::bind::BindCallError> {
        unreachable!("the controller binds no pod")
    }

    async fn create_reservation(
        &self,
        node: &str,
        gpu: u32,
        _: bool,
        _: &Template,
    ) -> Result<Option<Pod>, CreateError> {
        let r = self.call(format!("create {node}/{gpu}"));
        match (self.answer, r) {
            (Answer::Unanswered, _) => Err(CreateError::Unanswered),
            (_, Err(e)) => Err(CreateError::Api(e)),
            (_, Ok(())) => Ok(Some(Pod::default())),
        }
    }

    async fn delete_reservation(&self, name: &str, _: &str) -> Result<(), kube::Error> {
        self.call(format!("delete {name}"))
    }

    async fn fill(&self, fill: &Fill) -> Result<api::Fill, kube::Error> {
        self.call(format!("fill {} -> {}", fill.configmap, fill.to.uuid))?;
        Ok(self.fill.clone())
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), kube::Error> {
        let value = value.unwrap_or("<removed>");
        self.call(format!("annotate {namespace}/{name} {key}={value}"))
    }

    async fn delete_share(&self, owner: &Owner, why: &str) -> Result<(), kube::Error> {
        self.call(format!("evict {}/{}: {why}", owner.namespace, owner.name))
    }

    async fn evict(&self, _: &Owner) -> Result<crate::extender::executor::Evicted, kube::Error> {
        unreachable!("the reservation controller evicts nothing through the Eviction API")
    }

    async fn note(&self, owner: &Owner, _: bool, _: &str, reason: &str, note: &str) {
        self.calls.lock().unwrap().push(format!(
            "event {}/{} {reason}: {note}",
            owner.namespace, owner.name
        ));
    }
}

fn policy() -> Arc<LoadedPolicy> {
    PolicyStore::new(crate::policy::Policy::default_policy()).current()
}

/// A cluster's state with the per-GPU node `n1` and the shares `shares` on it.
fn state_with(shares: &[ObservedPod]) -> ExtenderState {
    let ext = ExtenderState::new(Mode::Cluster, Duration::from_secs(60));
    ext.mark_synced();
    ext.set_node("n1", Some(per_gpu_node()));
    for s in shares {
        ext.record(s);
    }
    ext
}

/// This tick's GPUs, with `reservations`.
fn gpus_of(ext: &ExtenderState, reservations: &[ReservationPod]) -> Vec<plan::Gpu> {
    gather(
        ext.ledger(),
        reservations,
        &FilledByOwner::new(),
        &mut HashMap::new(),
        Instant::now(),
    )
}

fn gpu_of(ext: &ExtenderState, uid: &str) -> Option<u32> {
    ext.ledger()
        .holding(uid)
        .and_then(|h| h.placement.gpus.first().map(|(i, _)| *i))
}

fn ready(gpu: u32) -> ReservationPod {
    reservation(
        gpu,
        ReservationState::Ready {
            uuid: format!("GPU-{gpu}"),
        },
    )
}

fn failed(gpu: u32) -> ReservationPod {
    reservation(
        gpu,
        ReservationState::Failed {
            why: "the MPS daemon exited".into(),
        },
    )
}

/// Decides moving share `a` off GPU 0 (its reservation failed) over `ext`.
fn move_a<'a>(ext: &'a ExtenderState, gpus: &[plan::Gpu]) -> Decided<'a> {
    let share = gpus[0]
        .shares
        .iter()
        .find(|s| s.uid == "a")
        .unwrap()
        .clone();
    let action = Action::Move {
        share,
        why: "its reservation failed".into(),
    };
    decide(ext, &policy(), &Template::default(), &gpus[0], gpus, action)
}

/// A share moved off a failed reservation's GPU: the ledger holds it on the new GPU before the
/// annotation is written; the API refusing it, the ledger says the old GPU again, as the API
/// does, and nothing is said on the pod; accepted, an event says where it went.
#[tokio::test]
async fn a_move_the_api_refuses_leaves_the_share_where_the_api_has_it() {
    let ext = state_with(&[share("a", 0, 300)]);
    let gpus = gpus_of(&ext, &[failed(0), ready(1)]);
    let Decided::Do(step) = move_a(&ext, &gpus) else {
        panic!("a move");
    };
    assert!(matches!(*step, Step::Move(_)), "a move");
    assert_eq!(gpu_of(&ext, "a"), Some(1), "held on GPU 1 before the call");
    let io = Fake::answering(Answer::Status(500));
    assert!(carry_out(&io, *step).await.is_err());
    assert_eq!(gpu_of(&ext, "a"), Some(0), "back where the API has it");
    assert_eq!(io.calls().len(), 1, "{:?}", io.calls());
    assert!(io.calls()[0].starts_with("annotate ml/p-a gpu-share.io/gpus="));

    let gpus = gpus_of(&ext, &[failed(0), ready(1)]);
    let Decided::Do(step) = move_a(&ext, &gpus) else {
        panic!("a move");
    };
    let io = Fake::answering(Answer::Accepted);
    carry_out(&io, *step).await.unwrap();
    assert_eq!(gpu_of(&ext, "a"), Some(1));
    let calls = io.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls[1].starts_with("event ml/p-a GpuShareMoved: its reservation failed; pointed at GPU 1 of the node instead"),
        "{calls:?}"
    );
    ext.ledger()
        .with_node("n1", |nl| assert!(nl.within_capacity()))
        .unwrap();
}

/// With no room on another ready GPU, the share is evicted, and the eviction says why.
#[tokio::test]
async fn a_share_with_nowhere_to_go_is_evicted_in_words() {
    let ext = state_with(&[share("a", 0, 300), share("b", 1, 800)]);
    let gpus = gpus_of(&ext, &[failed(0), ready(1)]);
    let Decided::Do(step) = move_a(&ext, &gpus) else {
        panic!("an eviction");
    };
    assert!(matches!(*step, Step::Evict { .. }), "an eviction");
    assert_eq!(gpu_of(&ext, "a"), Some(0), "the ledger does not move it");
    let io = Fake::answering(Answer::Accepted);
    carry_out(&io, *step).await.unwrap();
    assert_eq!(
        io.calls(),
        [
            "evict ml/p-a: its reservation failed; no other GPU gpu-share holds on node n1 has room for it"
        ]
    );
}

/// A devices ConfigMap of the share's name that gpu-share did not write for this GPU is
/// immutable: the share is evicted, and the eviction names the ConfigMap and the GPU.
#[tokio::test]
async fn a_share_whose_configmap_is_foreign_is_evicted_in_words() {
    let ext = state_with(&[share("a", 1, 300)]);
    let gpus = gpus_of(&ext, &[ready(1)]);
    let g = gpus.iter().find(|g| g.index == 1).unwrap();
    let actions = plan::plan(g, Duration::from_secs(30));
    let fill = actions
        .into_iter()
        .find(|a| matches!(a, Action::Fill { .. }))
        .expect("an unfilled share on a ready GPU is filled");
    let Decided::Do(step) = decide(&ext, &policy(), &Template::default(), g, &gpus, fill) else {
        panic!("a fill");
    };
    assert!(matches!(*step, Step::Fill { .. }), "a fill");
    let mut io = Fake::answering(Answer::Accepted);
    io.fill = api::Fill::Foreign("it holds \"GPU-9\"".into());
    carry_out(&io, *step).await.unwrap();
    let calls = io.calls();
    assert_eq!(calls[0], "fill gpu-share-devices-a -> GPU-1");
    assert!(
        calls[1].starts_with("evict ml/p-a: its devices ConfigMap gpu-share-devices-a already exists and it holds \"GPU-9\"; it is immutable, so the pod cannot be pointed at GPU 1 of node n1 (GPU-1)"),
        "{calls:?}"
    );
}

/// How many stand-ins hold GPUs of `n1` for their reservations.
fn stand_ins(ext: &ExtenderState) -> usize {
    ext.ledger()
        .with_node("n1", |nl| {
            nl.holdings
                .values()
                .filter(|h| h.pod.holder == Holder::StandIn)
                .count()
        })
        .unwrap()
}

/// A vanished reservation is created again with its GPU held from before the create leaves: a
/// refusal (nothing created) releases the hold, no answer (perhaps created) keeps it, and an
/// acceptance keeps it until the watch shows the pod.
#[tokio::test]
async fn a_recreated_reservation_holds_its_gpu_by_what_the_create_came_to() {
    for (answer, held) in [
        (Answer::Status(403), 0),
        (Answer::Status(500), 1),
        (Answer::Unanswered, 1),
        (Answer::Accepted, 1),
    ] {
        let ext = state_with(&[share("a", 2, 300)]);
        let gpus = gpus_of(&ext, &[]);
        let action = Action::Recreate {
            node: "n1".into(),
            gpu: 2,
            mps: false,
        };
        let Decided::Do(step) = decide(
            &ext,
            &policy(),
            &Template::default(),
            &gpus[0],
            &gpus,
            action,
        ) else {
            panic!("a create");
        };
        assert!(matches!(*step, Step::Create { .. }), "a create");
        assert_eq!(stand_ins(&ext), 1, "held before the create leaves");
        let io = Fake::answering(answer);
        let done = execute(&io, &Metrics::new(), &gpus[0], Decided::Do(step)).await;
        assert_eq!(done, answer == Answer::Accepted, "{answer:?}");
        assert_eq!(io.calls(), ["create n1/2"]);
        assert_eq!(stand_ins(&ext), held, "{answer:?}");
    }
    // Its shares gone since the tick began: nothing is created, and nothing held.
    let ext = state_with(&[share("a", 2, 300)]);
    let gpus = gpus_of(&ext, &[]);
    ext.release("a");
    let action = Action::Recreate {
        node: "n1".into(),
        gpu: 2,
        mps: false,
    };
    assert!(matches!(
        decide(
            &ext,
            &policy(),
            &Template::default(),
            &gpus[0],
            &gpus,
            action
        ),
        Decided::Skip(_)
    ));
    assert_eq!(stand_ins(&ext), 0);
}

/// A released reservation whose GPU a bind gave a share since the tick began stays, and is
/// weighed again next tick; a failed one goes all the same.
#[tokio::test]
async fn a_released_reservation_stays_while_a_share_arrives() {
    let ext = state_with(&[]);
    let gpus = gpus_of(&ext, &[ready(3)]);
    ext.record(&share("late", 3, 300));
    let delete = |failed| Action::Delete {
        reservation: crate::reservation::name("n1", 3),
        uid: "r-3".into(),
        why: "released".into(),
        failed,
    };
    let io = Fake::answering(Answer::Accepted);
    let decided = decide(
        &ext,
        &policy(),
        &Template::default(),
        &gpus[0],
        &gpus,
        delete(false),
    );
    assert!(matches!(decided, Decided::Wait));
    assert!(!execute(&io, &Metrics::new(), &gpus[0], decided).await);
    assert!(io.calls().is_empty());
    let decided = decide(
        &ext,
        &policy(),
        &Template::default(),
        &gpus[0],
        &gpus,
        delete(true),
    );
    assert!(execute(&io, &Metrics::new(), &gpus[0], decided).await);
    assert_eq!(
        io.calls(),
        [format!("delete {}", crate::reservation::name("n1", 3))]
    );
}
