//! `defrag.mode: on` over a cluster's state: holds before anything moves, evictions through the
//! Eviction API in the plan's order, the replacement steered to its held target by filter and
//! bind, the node room is made on held for the waiting pod, and every way a plan ends (done,
//! refused midway, lapsed, orphaned by a restart) leaving no hold behind.

use super::*;
use crate::defrag::flight::ANNOTATION_PLAN;
use crate::extender::bind::{BindAnswers, Ended, decide};
use crate::extender::wire::ExtenderArgs;
use crate::ledger::{BindPod, PodRef, promise_key};
use crate::packing::{Demand, GpuDemand, Reason};
use crate::shared::LoadedPolicy;

fn on(namespaces: &[&str]) -> Policy {
    let mut p = policy(namespaces);
    p.defrag.mode = DefragMode::On;
    p
}

/// Nodes of four L40S (`n0`, `n1`, ...), `pods` recorded as bound, `waiting` waiting and
/// marked refused for room by filter.
fn build(nodes: &[&str], pods: Vec<Pod>, waiting: Pod) -> (ExtenderState, Fake) {
    let ext = ExtenderState::new(Mode::Cluster, Duration::from_secs(60));
    for n in nodes {
        ext.apply_node(
            n,
            NodeFacts::default(),
            Some(GpuNode::whole(n, "NVIDIA-L40S", 4, 46068)),
        );
    }
    for p in &pods {
        ext.observe_pod(p);
    }
    ext.mark_synced();
    let m = &waiting.metadata;
    ext.note_no_room(
        m.uid.as_deref().unwrap(),
        NoRoom {
            namespace: m.namespace.clone().unwrap(),
            name: m.name.clone().unwrap(),
            class: "exclusive",
        },
    );
    let mut all = pods;
    all.push(waiting);
    (ext, serving(all))
}

/// n0: `a` (a ReplicaSet's) on GPU 0, `b` (another's) on GPU 1, bare pods on 2 and 3; n1 and
/// n2: GPU 0 free, bare pods on the rest. `big` (`exclusive-2`) waits: moving `a` and `b` to
/// n1 and n2 frees two GPUs on n0.
fn two_moves() -> (ExtenderState, Fake) {
    let mut pods = vec![
        pod("a", 1, Some("n0"), &[0], true, json!({})),
        pod("b", 1, Some("n0"), &[1], true, json!({})),
        pod("s2", 1, Some("n0"), &[2], false, json!({})),
        pod("s3", 1, Some("n0"), &[3], false, json!({})),
    ];
    for n in ["n1", "n2"] {
        for g in 1..4u32 {
            pods.push(pod(
                &format!("{n}-t{g}"),
                1,
                Some(n),
                &[g],
                false,
                json!({}),
            ));
        }
    }
    build(
        &["n0", "n1", "n2"],
        pods,
        pod("big", 2, None, &[], false, json!({})),
    )
}

/// A pending replacement of `moved` (same controller and template), named `name`.
fn replacement(moved: &Pod, name: &str) -> Pod {
    let mut p = moved.clone();
    p.metadata.name = Some(name.into());
    p.metadata.uid = Some(format!("u-{name}"));
    p.metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("gpu-share.io/gpus");
    p.spec.as_mut().unwrap().node_name = None;
    p.status.as_mut().unwrap().phase = Some("Pending".into());
    p
}

/// The nodes filter passes `pod` among `names`, and the reasons of those it refuses.
fn filtered(
    ext: &ExtenderState,
    policy: &Policy,
    pod: &Pod,
    names: &[&str],
) -> (Vec<String>, String) {
    let out = crate::extender::handlers::filter(
        ext,
        &LoadedPolicy::new(policy.clone()),
        &Metrics::new(),
        ExtenderArgs {
            pod: Some(pod.clone()),
            nodes: None,
            node_names: Some(names.iter().map(|n| n.to_string()).collect()),
        },
    );
    let reasons = [
        &out.reply.failed_nodes,
        &out.reply.failed_and_unresolvable_nodes,
    ]
    .into_iter()
    .flatten()
    .flat_map(|r| r.0.iter().map(|(n, w)| format!("{n}: {w}")))
    .collect::<Vec<_>>()
    .join("; ");
    (out.reply.node_names.unwrap_or_default(), reasons)
}

/// Binds `pod` to `node` as bind does (no API: the holding is the answer).
fn bind(
    ext: &ExtenderState,
    policy: &Policy,
    pod: &Pod,
    node: &str,
) -> Result<(), crate::extender::bind::HoldError> {
    let read = BindPod::of(pod);
    let d = decide(
        ext,
        &LoadedPolicy::new(policy.clone()),
        &Template::default(),
        &read,
        node,
        false,
    )?;
    d.settle(BindAnswers::Tried {
        created: None,
        ended: Ended::Bound,
    });
    Ok(())
}

/// No promise and no fence left anywhere.
fn nothing_held(ext: &ExtenderState, waiting: &str) {
    for i in 0..4 {
        assert_eq!(
            ext.ledger().node_of(&promise_key(waiting, i)),
            None,
            "promise {i}"
        );
    }
    assert!(ext.ledger().fences_now().is_empty(), "no fence");
    assert!(ext.flights().is_empty(), "no plan under way");
}

/// The whole path: the target held and the node fenced before the eviction, the replacement
/// steered to its target and placed in its promise, other pods kept off the freed room, the
/// waiting pod placed there, and the plan ended with nothing held.
#[tokio::test]
async fn a_plan_holds_first_evicts_steers_and_ends_with_nothing_held() {
    let (ext, fake) = cluster(json!({}), json!({}));
    let policy = on(&["ml"]);
    let metrics = Metrics::new();
    let mut memory = Memory::default();
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    assert_eq!(
        fake.calls(),
        [
            format!("annotate ml/big {ANNOTATION_PLAN} written"),
            "evict ml/a".to_string()
        ],
        "the plan written before anything moves, then the eviction"
    );
    let events = fake.events();
    assert!(
        events[0].starts_with("Defragmentation GpuShareDefragMoving ml/big: moving ml/a from node n0 to n1 makes room on node n0 (GPU 0, 1): the targets are held"),
        "{events:?}"
    );
    assert!(
        events[1].starts_with("Defragmentation GpuShareDefragMoved ml/a: evicted to make room for ml/big on node n0: its replacement is steered to node n1"),
        "{events:?}"
    );
    let promise = promise_key("u-big", 0);
    assert_eq!(ext.ledger().node_of(&promise).as_deref(), Some("n1"));
    assert_eq!(ext.ledger().fences_now()["n0"].waiting, "u-big");
    let recorded = crate::defrag::flight::recorded(&fake.pod("ml/big").unwrap()).unwrap();
    assert_eq!(
        (recorded.node.as_str(), recorded.moves.clone()),
        ("n0", vec!["ml/a".to_string()])
    );

    // The eviction lands: `a` leaves. Its GPU is free, but held for `big`: another pod asking
    // one GPU is kept off n0, in words, and the ledger refuses it there too.
    ext.forget_pod("u-a");
    let other = pod("other", 1, None, &[], false, json!({}));
    let (passed, why) = filtered(&ext, &policy, &other, &["n0", "n1"]);
    assert!(passed.is_empty(), "{passed:?}");
    assert!(
        why.contains("n0: a defragmentation plan is making room on this node for a waiting pod (for ml/big: moving ml/a"),
        "{why}"
    );
    let e = bind(&ext, &policy, &other, "n0").unwrap_err().to_string();
    assert!(e.contains("a defragmentation plan is making room"), "{e}");

    // The replacement (same ReplicaSet, a new name) is passed its held target alone, and takes
    // the promise's place there.
    let a = fake.pod("ml/a").unwrap();
    let a2 = replacement(&a, "a-2");
    let (passed, why) = filtered(&ext, &policy, &a2, &["n0", "n1"]);
    assert_eq!(passed, ["n1"], "{why}");
    assert!(
        why.is_empty() || why.contains("its room is held on another node"),
        "{why}"
    );
    bind(&ext, &policy, &a2, "n1").unwrap();
    assert_eq!(ext.ledger().node_of(&promise), None, "the promise redeemed");
    assert_eq!(ext.ledger().node_of("u-a-2").as_deref(), Some("n1"));

    // The waiting pod fits n0 now and binds there.
    let (passed, _) = filtered(&ext, &policy, &fake.pod("ml/big").unwrap(), &["n0", "n1"]);
    assert_eq!(passed, ["n0"]);
    let mut big = fake.pod("ml/big").unwrap();
    bind(&ext, &policy, &big, "n0").unwrap();
    big.spec.as_mut().unwrap().node_name = Some("n0".into());
    fake.put(big);

    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    let events = fake.events();
    assert!(
        events.last().unwrap().starts_with("Defragmentation GpuShareDefragDone ml/big: placed on node n0 after 1 move(s) (1 replacement(s) placed on their held targets)"),
        "{events:?}"
    );
    assert_eq!(
        fake.calls().last().unwrap(),
        &format!("annotate ml/big {ANNOTATION_PLAN} removed")
    );
    nothing_held(&ext, "u-big");
    assert!(ext.plans.on("n0").is_empty());
    let text = metrics.encode();
    assert!(
        text.contains("gpu_share_defrag_gpus_freed_total 2"),
        "{text}"
    );
    assert!(
        text.contains("gpu_share_defrag_evictions_total{outcome=\"evicted\"} 1"),
        "{text}"
    );
}

/// The second eviction of a plan refused (a PodDisruptionBudget): the plan is unwound, every
/// hold released, the annotation taken off, the waiting pod told why, and the refused workload
/// left alone for the cooldown.
#[tokio::test]
async fn an_eviction_refused_midway_unwinds_the_plan() {
    let (ext, fake) = two_moves();
    *fake.refuse_after.lock().unwrap() = Some(1);
    let policy = on(&["ml"]);
    let metrics = Metrics::new();
    let mut memory = Memory::default();
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    let calls = fake.calls();
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert!(
        calls[1].starts_with("evict ") && calls[2].starts_with("evict "),
        "{calls:?}"
    );
    assert_eq!(
        calls[3],
        format!("annotate ml/big {ANNOTATION_PLAN} removed")
    );
    let events = fake.events();
    let gave_up = events.last().unwrap();
    assert!(
        gave_up.starts_with(
            "Defragmentation GpuShareDefragGaveUp ml/big: gave up the plan (moving ml/"
        ),
        "{events:?}"
    );
    assert!(
        gave_up.contains(
            "was refused (Cannot evict pod as it would violate the pod's disruption budget.)"
        ) && gave_up.ends_with("its holds are released"),
        "{gave_up}"
    );
    nothing_held(&ext, "u-big");
    let text = metrics.encode();
    assert!(
        text.contains("gpu_share_defrag_plans_given_up_total{reason=\"eviction-refused\"} 1"),
        "{text}"
    );
    // Weighed again, both workloads are cooling down (one moved, one refused): no plan, in words.
    memory.weighed.clear();
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    let last = fake.events().last().unwrap().clone();
    assert!(
        last.contains("GpuShareNoDefragPlan")
            && last.contains("had a pod moved, or an eviction refused, within the cooldown"),
        "{last}"
    );
    assert_eq!(fake.calls().len(), 4, "nothing more evicted");
}

/// A plan whose waiting pod is not placed by its deadline lapses, leaving nothing held.
#[tokio::test]
async fn a_plan_lapses_at_its_deadline_with_nothing_held() {
    let (ext, fake) = cluster(json!({}), json!({}));
    let policy = on(&["ml"]);
    let metrics = Metrics::new();
    let mut memory = Memory::default();
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    assert_eq!(ext.flights().len(), 1);
    ext.with_flight("u-big", |f| f.deadline = f.started);
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    let last = fake.events().last().unwrap().clone();
    assert!(
        last.contains("GpuShareDefragGaveUp") && last.contains("not done within 0 s"),
        "{last}"
    );
    nothing_held(&ext, "u-big");
    assert!(crate::defrag::flight::recorded(&fake.pod("ml/big").unwrap()).is_none());
}

/// A waiting pod carrying a plan this replica does not hold (it restarted) has the plan
/// unwound: the annotation taken off and the pod told, nothing evicted.
#[tokio::test]
async fn a_plan_begun_before_a_restart_is_unwound() {
    let (ext, fake) = cluster(json!({}), json!({}));
    let policy = on(&["ml"]);
    let metrics = Metrics::new();
    let mut memory = Memory::default();
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    assert!(
        fake.pod("ml/big")
            .unwrap()
            .metadata
            .annotations
            .unwrap()
            .contains_key(ANNOTATION_PLAN)
    );
    // A restarted extender: the same API, a fresh state (the evicted `a` is gone).
    let (fresh, _) = cluster(json!({}), json!({}));
    fresh.forget_pod("u-a");
    let mut memory = Memory::default();
    let before = fake.calls().len();
    tick_with(&fresh, &fake, &policy, &metrics, &mut memory).await;
    let calls = fake.calls();
    assert_eq!(
        calls[before..],
        [format!("annotate ml/big {ANNOTATION_PLAN} removed")],
        "{calls:?}"
    );
    let last = fake.events().last().unwrap().clone();
    assert!(
        last.contains("GpuShareDefragGaveUp")
            && last.contains("no longer holds it (restarted, or no longer leading): moving ml/a to make room on node n0"),
        "{last}"
    );
    nothing_held(&fresh, "u-big");
}

/// At most `movesAtOnce` moves are under way over every plan: with one allowed, a second
/// waiting pod is not weighed while the first plan's move has not landed.
#[tokio::test]
async fn moves_at_once_bounds_the_moves_under_way() {
    let (ext, fake) = cluster(json!({}), json!({}));
    let mut policy = on(&["ml"]);
    policy.defrag.moves_at_once = 1;
    let metrics = Metrics::new();
    let mut memory = Memory::default();
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    assert_eq!(ext.moves_under_way(), 1);
    // A second pod waits for room.
    let second = pod("second", 2, None, &[], false, json!({}));
    fake.put(second);
    ext.note_no_room(
        "u-second",
        NoRoom {
            namespace: "ml".into(),
            name: "second".into(),
            class: "exclusive",
        },
    );
    let before = fake.events().len();
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    assert_eq!(fake.events().len(), before, "{:?}", fake.events());
    assert_eq!(
        fake.calls()
            .iter()
            .filter(|c| c.starts_with("evict"))
            .count(),
        1
    );
}

/// A plan longer than `movesAtOnce` is begun whole (every target held) and evicted in waves:
/// with one move allowed under way, the second pod is evicted only once the first one's
/// replacement has landed on its target, and a replacement is steered only once its pod is
/// evicted.
#[tokio::test]
async fn a_plan_longer_than_moves_at_once_evicts_as_replacements_land() {
    let (ext, fake) = two_moves();
    let mut policy = on(&["ml"]);
    policy.defrag.moves_at_once = 1;
    let metrics = Metrics::new();
    let mut memory = Memory::default();
    let evictions = |fake: &Fake| {
        fake.calls()
            .into_iter()
            .filter(|c| c.starts_with("evict"))
            .collect::<Vec<_>>()
    };
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    assert_eq!(evictions(&fake), ["evict ml/a"]);
    assert_eq!(ext.moves_under_way(), 1);
    // Both targets held from the start.
    for i in 0..2 {
        assert!(
            ext.ledger().node_of(&promise_key("u-big", i)).is_some(),
            "promise {i}"
        );
    }
    // `b` still runs: a pod of its workload is no replacement yet, and goes where filter says.
    let b = fake.pod("ml/b").unwrap();
    assert_eq!(ext.steer(&BindPod::of(&replacement(&b, "b-early"))), None);
    // Nothing lands: the next tick evicts nothing more.
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    assert_eq!(evictions(&fake), ["evict ml/a"]);
    // `a`'s replacement lands on its target: the next tick evicts `b`.
    ext.forget_pod("u-a");
    let a2 = replacement(&fake.pod("ml/a").unwrap(), "a-2");
    let to = ext.ledger().node_of(&promise_key("u-big", 0)).unwrap();
    bind(&ext, &policy, &a2, &to).unwrap();
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    assert_eq!(evictions(&fake), ["evict ml/a", "evict ml/b"]);
    assert_eq!(ext.moves_under_way(), 1);
}

/// A promise is the ledger's like any holding: a pod that does not replace the moved one is
/// placed beside it, never in it.
#[test]
fn a_promise_holds_its_room_against_other_pods() {
    let (ext, _) = cluster(json!({}), json!({}));
    let scorer = ext.scorer(crate::packing::PackingPolicy::default());
    let plan = crate::defrag::Plan {
        node: "n0".into(),
        placement: Default::default(),
        moves: vec![crate::defrag::Move {
            id: "u-a".into(),
            key: "ml/a".into(),
            workload: "ml/ReplicaSet/a-rs".into(),
            from: "n0".into(),
            to: "n1".into(),
            demand: Demand::gpu(GpuDemand::Whole { count: 1 }),
            placement: Default::default(),
        }],
        releases: vec![],
        cost: Default::default(),
    };
    let flight = crate::defrag::flight::Flight::begin(
        crate::defrag::flight::PodId {
            uid: "u-big".into(),
            namespace: "ml".into(),
            name: "big".into(),
        },
        plan,
        vec![crate::defrag::flight::Lineage {
            controller: "u-a-rs".into(),
            template: None,
        }],
        0,
        300,
    );
    ext.begin_flight(&scorer, flight, Duration::from_secs(300))
        .unwrap();
    let mut b = ext.begin_bind("u-x", "n1", false);
    let held = b.hold(
        &scorer,
        PodRef::new("u-x", "ml", "x"),
        Demand::gpu(GpuDemand::Whole { count: 1 }),
    );
    assert_eq!(
        held,
        Err(Reason::NoFreeGpus),
        "n1's one free GPU is promised"
    );
    b.abort();
    ext.end_flight("u-big");
    nothing_held(&ext, "u-big");
}

/// A replacement whose bind fails after taking its promise does not take the room with it: the
/// next tick holds the promise again, and the next replacement is steered to it.
#[tokio::test]
async fn a_promise_taken_by_a_failed_bind_is_held_again() {
    let (ext, fake) = cluster(json!({}), json!({}));
    let policy = on(&["ml"]);
    let metrics = Metrics::new();
    let mut memory = Memory::default();
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    ext.forget_pod("u-a");
    let a = fake.pod("ml/a").unwrap();
    let a2 = replacement(&a, "a-2");
    let d = decide(
        &ext,
        &LoadedPolicy::new(policy.clone()),
        &Template::default(),
        &BindPod::of(&a2),
        "n1",
        false,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let promise = promise_key("u-big", 0);
    assert_eq!(ext.ledger().node_of(&promise), None, "taken by the bind");
    // A second pod of the lineage is not offered the promise taken.
    assert_eq!(ext.steer(&BindPod::of(&replacement(&a, "a-3"))), None);
    d.abort();
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    assert_eq!(
        ext.ledger().node_of(&promise).as_deref(),
        Some("n1"),
        "held again"
    );
    let a3 = replacement(&a, "a-3");
    let (passed, why) = filtered(&ext, &policy, &a3, &["n0", "n1"]);
    assert_eq!(passed, ["n1"], "{why}");
    bind(&ext, &policy, &a3, "n1").unwrap();
    assert_eq!(ext.ledger().node_of("u-a-3").as_deref(), Some("n1"));
    assert_eq!(
        ext.flights()[0].legs[0],
        crate::defrag::flight::Leg::Evicted
    );
    tick_with(&ext, &fake, &policy, &metrics, &mut memory).await;
    assert_eq!(ext.flights()[0].legs[0], crate::defrag::flight::Leg::Landed);
}
