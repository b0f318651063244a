use super::*;

fn settings() -> Settings {
    Settings {
        sans: vec!["gpu-share.gpu-share.svc".into(), "127.0.0.1".into()],
        serving_validity: Duration::days(30),
        ca_validity: Duration::days(90),
        propagation: Duration::minutes(5),
    }
}

fn t0() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
}

/// The cluster the keeper works on: its Secrets, the webhooks' caBundles, and what the Secret
/// held over time (what a replica that sees it late serves).
struct World {
    ca: Option<PemPair>,
    served: Option<Served>,
    bundles: Vec<Option<String>>,
    history: Vec<(OffsetDateTime, PemPair)>,
    bundle_history: Vec<(OffsetDateTime, String)>,
    writes: Vec<&'static str>,
}

impl World {
    fn new() -> Self {
        World {
            ca: None,
            served: None,
            bundles: vec![None, None, None, None],
            history: Vec::new(),
            bundle_history: Vec::new(),
            writes: Vec::new(),
        }
    }

    fn observe(&self, now: OffsetDateTime) -> Observed {
        Observed {
            now,
            ca: self.ca.clone(),
            served: self.served.clone(),
            ca_bundles: self.bundles.clone(),
        }
    }

    /// Takes one step at `now`; returns when to look next.
    fn step(&mut self, now: OffsetDateTime, s: &Settings) -> OffsetDateTime {
        match next_step(&self.observe(now), s).unwrap() {
            Step::WriteCa { ca, why } => {
                self.writes.push(why);
                self.ca = Some(ca);
            }
            Step::WriteServed { served, why } => {
                self.writes.push(why);
                if self.served.as_ref().map(|s| &s.serving) != Some(&served.serving) {
                    self.history.push((now, served.serving.clone()));
                }
                self.served = Some(served);
            }
            Step::WriteBundles { bundle } => {
                self.writes.push("bundles");
                self.bundles = vec![Some(bundle.clone()); self.bundles.len()];
                self.bundle_history.push((now, bundle));
            }
            Step::Wait { until } => {
                assert!(until > now, "a wait must end later: {until} at {now}");
                return until.min(now + Duration::hours(6));
            }
        }
        now + Duration::seconds(30).min(s.propagation / 8)
    }

    /// What a replica that sees the Secret `lag` late serves at `now`.
    fn serving_at(&self, now: OffsetDateTime, lag: Duration) -> Option<&PemPair> {
        self.history
            .iter()
            .rev()
            .find(|(t, _)| *t <= now - lag)
            .map(|(_, p)| p)
            .or(self.history.first().map(|(_, p)| p))
    }

    /// What the API server trusts at `now`.
    fn trusted_at(&self, now: OffsetDateTime) -> Option<&String> {
        self.bundle_history
            .iter()
            .rev()
            .find(|(t, _)| *t <= now)
            .map(|(_, b)| b)
    }
}

/// Whether `serving` chains to a CA of `bundle` and is valid at `now`.
fn trusted(serving: &PemPair, bundle: &str, now: OffsetDateTime) -> bool {
    let Some(cert) = Cert::parse(&serving.cert_pem).into_iter().next() else {
        return false;
    };
    now >= cert.not_before
        && now < cert.not_after
        && Cert::parse(bundle).iter().any(|ca| cert.signed_by(ca))
}

/// A fresh install comes up in three writes (CA, Secret, caBundles), and then, over 400 days of
/// renewals of serving certificates (30 days) and CAs (90 days), every replica, whether it sees
/// the Secret at once or up to 4 minutes late, serves a certificate the API server trusts,
/// whether it sees the caBundle at once or a minute late, at every moment the keeper looks, and
/// just after each write.
#[test]
fn no_client_ever_distrusts_what_a_replica_serves() {
    no_distrust(&settings(), Duration::days(400), 6, 20);
    // The control-plane point's seconds: serving 60 s, CA 150 s, propagation 8 s, for 20
    // minutes (a certificate must not be born due: it would be renewed at every look).
    let seconds = Settings {
        serving_validity: Duration::seconds(60),
        ca_validity: Duration::seconds(150),
        propagation: Duration::seconds(8),
        ..settings()
    };
    no_distrust(&seconds, Duration::minutes(20), 8, 20);
}

fn no_distrust(s: &Settings, span: Duration, min_cas: usize, min_servings: usize) {
    let mut w = World::new();
    let mut now = t0();
    let s = s.clone();
    // A replica sees the Secret up to four fifths of the propagation time late, the API server
    // the caBundle up to a fifth.
    let (replica_lag, api_lag) = (s.propagation * 4 / 5, s.propagation / 5);
    for _ in 0..3 {
        now = w.step(now, &s);
    }
    assert_eq!(
        w.writes,
        [
            "no CA yet (or it is no CA, or not its key)",
            "no serving certificate yet",
            "bundles"
        ]
    );
    let end = t0() + span;
    let mut checks = 0;
    while now < end {
        let before = w.writes.len();
        let next = w.step(now, &s);
        let wrote = w.writes.len() > before;
        let moments: Vec<OffsetDateTime> = if wrote {
            vec![now, now + Duration::seconds(1), now + replica_lag]
        } else {
            vec![now]
        };
        for at in moments {
            // An API server that sees the caBundle at once or a minute late.
            for api_lag in [Duration::ZERO, api_lag] {
                let Some(bundle) = w.trusted_at(at - api_lag) else {
                    continue;
                };
                for lag in [Duration::ZERO, replica_lag] {
                    let serving = w.serving_at(at, lag).unwrap();
                    assert!(
                        trusted(serving, bundle, at),
                        "at {at} (replica {lag} late, API server {api_lag} late): a replica serves a certificate the API server does not trust; writes so far: {:?}",
                        w.writes
                    );
                    checks += 1;
                }
            }
        }
        now = next;
    }
    let cas = w.writes.iter().filter(|x| x.starts_with("the CA")).count();
    let servings = w.history.len();
    assert!(cas >= min_cas, "CA renewals: {cas} ({:?})", w.writes);
    assert!(servings >= min_servings, "serving certificates: {servings}");
    // Renewals, not churn: no certificate renewed sooner than a third of its life after it began.
    let writes = w.writes.len();
    assert!(
        writes < 10 * (cas + servings) + 10,
        "{writes} writes for {cas} CAs and {servings} serving certificates: {:?}",
        &w.writes[..writes.min(40)]
    );
    assert!(checks > 100, "{checks}");
}

/// The rule the invariant rests on: a serving certificate from a new CA waits until the bundle
/// with that CA has been everywhere for the propagation time.
#[test]
fn a_new_ca_signs_nothing_before_its_bundle_has_propagated() {
    let s = settings();
    let mut w = World::new();
    let mut now = t0();
    for _ in 0..3 {
        now = w.step(now, &s);
    }
    // Run until the CA is due (sixty days on, the serving certificate renewed meanwhile): a new
    // CA, then the bundle of both, then the caBundles.
    let old_ca = w.ca.clone().unwrap();
    while !matches!(
        next_step(&w.observe(now), &s).unwrap(),
        Step::WriteCa { .. }
    ) {
        now = w.step(now, &s);
        assert!(now < t0() + Duration::days(70), "{:?}", w.writes);
    }
    now = w.step(now, &s);
    assert_ne!(w.ca.as_ref(), Some(&old_ca));
    now = w.step(now, &s);
    let bundle = &w.served.as_ref().unwrap().bundle;
    assert_eq!(Cert::parse(bundle).len(), 2, "old and new CA");
    now = w.step(now, &s);
    assert_eq!(w.writes.last(), Some(&"bundles"));
    // The serving certificate (old CA) is not switched before the propagation time.
    match next_step(&w.observe(now), &s).unwrap() {
        Step::Wait { until } => assert!(until > now && until <= now + s.propagation),
        other => panic!("switched too early: {other:?}"),
    }
    now += s.propagation;
    assert!(matches!(
        next_step(&w.observe(now), &s).unwrap(),
        Step::WriteServed {
            why: "the serving certificate is not the CA's",
            ..
        }
    ));
    now = w.step(now, &s);
    // The old CA stays trusted until the switch has propagated, then leaves.
    assert!(matches!(
        next_step(&w.observe(now), &s).unwrap(),
        Step::Wait { .. }
    ));
    now += s.propagation;
    now = w.step(now, &s);
    assert_eq!(w.writes.last(), Some(&"the CAs to trust changed"));
    assert_eq!(Cert::parse(&w.served.as_ref().unwrap().bundle).len(), 1);
    w.step(now, &s);
    assert_eq!(w.writes.last(), Some(&"bundles"));
}

/// What is not the keeper's is replaced in words: a CA whose key is another's, a serving key
/// that is not its certificate's, a certificate without the Service's name.
#[test]
fn broken_secrets_are_replaced_in_words() {
    let s = settings();
    let now = t0();
    let ca = new_ca(now, s.ca_validity).unwrap();
    let other = new_ca(now, s.ca_validity).unwrap();
    let mismatched = PemPair {
        cert_pem: ca.cert_pem.clone(),
        key_pem: other.key_pem.clone(),
    };
    let o = Observed {
        now,
        ca: Some(mismatched),
        served: None,
        ca_bundles: vec![],
    };
    assert!(matches!(
        next_step(&o, &s).unwrap(),
        Step::WriteCa {
            why: "no CA yet (or it is no CA, or not its key)",
            ..
        }
    ));
    let serving = issue(&ca, &s.sans, now, s.serving_validity).unwrap();
    let base = Served {
        serving: serving.clone(),
        bundle: ca.cert_pem.clone(),
        bundle_since: None,
        serving_since: None,
    };
    let look = |served: Served| {
        next_step(
            &Observed {
                now,
                ca: Some(ca.clone()),
                served: Some(served.clone()),
                ca_bundles: vec![Some(served.bundle.clone())],
            },
            &s,
        )
        .unwrap()
    };
    assert!(matches!(look(base.clone()), Step::Wait { .. }));
    let wrong_key = Served {
        serving: PemPair {
            key_pem: other.key_pem.clone(),
            ..serving.clone()
        },
        ..base.clone()
    };
    assert!(matches!(
        look(wrong_key),
        Step::WriteServed {
            why: "the serving key is not the certificate's",
            ..
        }
    ));
    let unnamed = Served {
        serving: issue(&ca, &["other.svc".to_string()], now, s.serving_validity).unwrap(),
        ..base.clone()
    };
    assert!(matches!(
        look(unnamed),
        Step::WriteServed {
            why: "the serving certificate lacks a name",
            ..
        }
    ));
    // A caBundle someone else changed is put back.
    let o = Observed {
        now,
        ca: Some(ca.clone()),
        served: Some(base.clone()),
        ca_bundles: vec![Some(base.bundle.clone()), Some(other.cert_pem.clone())],
    };
    assert_eq!(
        next_step(&o, &s).unwrap(),
        Step::WriteBundles {
            bundle: base.bundle.clone()
        }
    );
}
