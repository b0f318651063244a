//! The DRA API's reads: whether the cluster serves `resource.k8s.io/v1`, and the watch streams of
//! NVIDIA's driver's ResourceSlices and of every ResourceClaim, as [`crate::dra`]'s own types.
//! What the events do to the extender's state is `extender::dra`'s; this module only streams.

use std::borrow::Cow;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

use crate::dra::{API_GROUP, API_VERSION, DRIVER, ResourceClaim, ResourceSlice};

/// The API's ResourceSlice as kube reads it: the core's [`ResourceSlice`], with the
/// `kube::Resource` the core (which knows no client) cannot implement.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(transparent)]
struct SliceObject(ResourceSlice);

/// The API's ResourceClaim as kube reads it ([`SliceObject`]'s reason).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(transparent)]
struct ClaimObject(ResourceClaim);

/// An event of a wrapped object, as one of the object itself.
fn unwrapped<W, T>(event: Event<W>, inner: fn(W) -> T) -> Event<T> {
    match event {
        Event::Apply(o) => Event::Apply(inner(o)),
        Event::Delete(o) => Event::Delete(inner(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(inner(o)),
        Event::InitDone => Event::InitDone,
    }
}

impl kube::Resource for SliceObject {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "ResourceSlice".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        API_GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        API_VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "resourceslices".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

impl kube::Resource for ClaimObject {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "ResourceClaim".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        API_GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        API_VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "resourceclaims".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// Whether the API serves ResourceSlices and ResourceClaims in `resource.k8s.io/v1`
/// (Kubernetes 1.34 and later). `Err` when the API could not be asked.
pub async fn served(client: &Client) -> Result<bool, kube::Error> {
    match client
        .list_api_group_resources(&format!("{API_GROUP}/{API_VERSION}"))
        .await
    {
        Ok(list) => Ok(["resourceslices", "resourceclaims"]
            .iter()
            .all(|r| list.resources.iter().any(|x| x.name == *r))),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The slices of NVIDIA's GPU driver (`spec.driver=gpu.nvidia.com`), with backoff on errors.
pub fn slice_events(
    client: Client,
) -> BoxStream<'static, Result<Event<ResourceSlice>, watcher::Error>> {
    watcher::watcher(
        Api::<SliceObject>::all(client),
        watcher::Config::default().fields(&format!("spec.driver={DRIVER}")),
    )
    .default_backoff()
    .map(|r| r.map(|e| unwrapped(e, |o: SliceObject| o.0)))
    .boxed()
}

/// Every ResourceClaim's events, with backoff on errors.
pub fn claim_events(
    client: Client,
) -> BoxStream<'static, Result<Event<ResourceClaim>, watcher::Error>> {
    watcher::watcher(Api::<ClaimObject>::all(client), watcher::Config::default())
        .default_backoff()
        .map(|r| r.map(|e| unwrapped(e, |o: ClaimObject| o.0)))
        .boxed()
}

/// The DRA side as a list shows it: the driver's slices and every claim, a page at a time.
pub async fn list(client: &Client) -> Result<crate::dra::DraView, kube::Error> {
    let mut slices = Vec::new();
    crate::cluster::watch::list_pages(
        &Api::<SliceObject>::all(client.clone()),
        kube::api::ListParams::default().fields(&format!("spec.driver={DRIVER}")),
        |s| slices.push(s.0.clone()),
    )
    .await?;
    let mut claims = Vec::new();
    crate::cluster::watch::list_pages(
        &Api::<ClaimObject>::all(client.clone()),
        kube::api::ListParams::default(),
        |c| claims.extend(crate::dra::Claim::read(&c.0)),
    )
    .await?;
    let mut view = crate::dra::DraView::default();
    view.replace_slices(slices);
    view.replace_claims(claims);
    Ok(view)
}
