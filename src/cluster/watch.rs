//! The extender's reads of the API: the node and pod watch streams, the loop that hands each
//! event to a callback until shutdown, and lists a page at a time. What the events do to the
//! extender's state is `extender::sync`'s; this module only streams.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::shared::stopped;

/// Pods that hold nothing are left out server-side (the API sends a delete when a pod leaves).
pub const POD_FIELD_SELECTOR: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// Every node's events, with kube-runtime's backoff on errors.
pub fn node_events(client: Client) -> BoxStream<'static, Result<Event<Node>, watcher::Error>> {
    watcher::watcher(Api::<Node>::all(client), watcher::Config::default())
        .default_backoff()
        .boxed()
}

/// The events of every pod that may hold something ([`POD_FIELD_SELECTOR`]), with backoff.
pub fn pod_events(client: Client) -> BoxStream<'static, Result<Event<Pod>, watcher::Error>> {
    watcher::watcher(
        Api::<Pod>::all(client),
        watcher::Config::default().fields(POD_FIELD_SELECTOR),
    )
    .default_backoff()
    .boxed()
}

/// Hands each event of a stream to `apply` until the stream ends or shutdown; sets `synced`
/// after the first event `apply` calls the end of a complete list.
pub async fn drive<K, S, F>(
    mut stream: S,
    synced: Arc<AtomicBool>,
    what: &'static str,
    mut shutdown: watch::Receiver<bool>,
    mut apply: F,
) where
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Unpin,
    F: FnMut(Event<K>) -> bool,
{
    loop {
        let next = tokio::select! {
            _ = stopped(&mut shutdown) => return,
            n = stream.next() => n,
        };
        match next {
            Some(Ok(ev)) => {
                if apply(ev) && !synced.swap(true, Ordering::AcqRel) {
                    tracing::info!(what, "cache synced");
                }
            }
            Some(Err(e)) => {
                tracing::warn!(what, error = %e, "watch error; kube-runtime retries with backoff")
            }
            None => return,
        }
    }
}

/// Objects a reconcile list asks for at once, as the watches' lists and client-go's pager do.
pub const LIST_PAGE: u32 = 500;

/// Lists every object `api` holds, a page at a time (one consistent snapshot), handing each
/// to `each` as its page arrives: only what `each` keeps of a list of 150,000 pods stays in
/// memory.
pub async fn list_pages<K>(
    api: &Api<K>,
    params: ListParams,
    mut each: impl FnMut(&K),
) -> Result<(), kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut lp = params.limit(LIST_PAGE);
    loop {
        let page = api.list(&lp).await?;
        for o in &page.items {
            each(o);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// Lists the pods that may hold something ([`POD_FIELD_SELECTOR`]), a page at a time.
pub async fn list_pods(client: &Client, each: impl FnMut(&Pod)) -> Result<(), kube::Error> {
    let params = ListParams::default().fields(POD_FIELD_SELECTOR);
    list_pages(&Api::<Pod>::all(client.clone()), params, each).await
}

/// Lists every node, a page at a time.
pub async fn list_nodes(client: &Client, each: impl FnMut(&Node)) -> Result<(), kube::Error> {
    list_pages(
        &Api::<Node>::all(client.clone()),
        ListParams::default(),
        each,
    )
    .await
}

/// A store kept by a watch of `api` (relists included), until shutdown.
pub fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    mut shutdown: watch::Receiver<bool>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let mut stream = reflector::reflector(writer, watcher::watcher(api, config))
        .default_backoff()
        .boxed();
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                _ = stopped(&mut shutdown) => return,
                n = stream.next() => n,
            };
            match next {
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(what, error = %e, "watch error; kube-runtime retries with backoff")
                }
                None => return,
            }
        }
    });
    reader
}
