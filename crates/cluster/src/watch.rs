//! One adapter over kube-runtime's `watcher`: a watch's events become "applied", "deleted" and,
//! at the end of every (re-)list, "relisted: these are all that exist now", the way kubert's
//! index `reset` works. The watcher's ConfigMaps, Secrets, Namespaces and workloads, the listing
//! of a namespace that opted in, and the key Secret all go through it.
//!
//! A list's objects are passed on as they arrive (not buffered): what a consumer keeps of each is
//! small, the objects themselves may not be. Only their keys are collected, for the relist. A list
//! made by hand (pages of `list` calls) goes through the same [`Adapter`] as `Init`, one
//! `InitApply` per object and `InitDone`, and so ends in the same `Relisted`.
//!
//! Every (re-)list is a streaming list where the API server serves one ([`events`]).

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::Api;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

/// kube-runtime's watcher of `api`, whose lists are streaming lists (a watch with
/// `sendInitialEvents=true`: one request, the objects sent one by one from the API server's
/// watch cache, then a bookmark that says they are complete) where the API server serves them,
/// and pages of `paged` where it does not.
///
/// A paged list is a round trip per page, each checked against etcd for consistency: with pages
/// small enough for 1 MiB Secrets, 150,000 objects took kube-apiserver 10 to 15 times as long as
/// one bare list of pages of 500 (BENCHMARKS.md section 5). A streaming list holds one object at a
/// time, whatever the size of the others.
///
/// kube-apiserver serves them when its `WatchList` feature gate is on (1.32, and 1.34 on; 1.33
/// has it off). A server that does not refuses the watch as invalid (422; servers before
/// `sendInitialEvents` existed reject its `resourceVersionMatch` the same way): from the first
/// such refusal on, this watch lists in pages, for as long as it lives. So does a watch whose
/// streaming list goes quiet for [`INITIAL_EVENTS_QUIET`] without the bookmark that ends it (a
/// proxy that drops `sendInitialEvents` or the bookmark): the list would never end.
pub fn events<K>(
    api: Api<K>,
    paged: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    events_with(api, paged, INITIAL_EVENTS_QUIET)
}

/// How long a streaming list may send nothing before its end: kube-apiserver sends the initial
/// events back to back from its watch cache and the bookmark right after them (after waiting up
/// to 3 s for the cache to be fresh), so a pause this long means the bookmark is not coming.
pub const INITIAL_EVENTS_QUIET: std::time::Duration = std::time::Duration::from_secs(30);

/// [`events`] with the quiet time after which a streaming list is given up.
pub fn events_with<K>(
    api: Api<K>,
    paged: watcher::Config,
    quiet: std::time::Duration,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let streaming: BoxStream<'static, _> =
        watcher::watcher(api.clone(), paged.clone().streaming_lists()).boxed();
    // The paged watch to fall back to, until it is taken: while it is here, the lists stream.
    // `listing`: a streaming list has begun (Init) and not ended (InitDone).
    let state = (streaming, Some((api, paged)), false);
    futures::stream::unfold(
        state,
        move |(mut events, mut fallback, mut listing)| async move {
            loop {
                let next = if listing && fallback.is_some() {
                    match tokio::time::timeout(quiet, events.next()).await {
                        Ok(next) => next,
                        Err(_) => {
                            let (api, paged) = fallback.take()?;
                            tracing::warn!(
                                resource = api.resource_url(),
                                quiet = ?quiet,
                                "a streaming list sent nothing for this long without the bookmark that ends it (a proxy in between?); listing in pages"
                            );
                            events = watcher::watcher(api, paged).boxed();
                            listing = false;
                            continue;
                        }
                    }
                } else {
                    events.next().await
                };
                let item = next?;
                match &item {
                    Ok(Event::Init) => listing = true,
                    // An error ends the watch: the next list begins with its own Init, and the
                    // backoff before it is no quiet of a live list.
                    Ok(Event::InitDone) | Err(_) => listing = false,
                    _ => {}
                }
                if let Err(e) = &item
                    && refuses_watch_lists(e)
                    && let Some((api, paged)) = fallback.take()
                {
                    tracing::info!(
                        resource = api.resource_url(),
                        error = %crate::redact::watcher_error(e),
                        "the API server does not serve streaming lists; listing in pages"
                    );
                    events = watcher::watcher(api, paged).boxed();
                    listing = false;
                    continue;
                }
                return Some((item, (events, fallback, listing)));
            }
        },
    )
}

/// Whether the API server refused a watch that asked for a streaming list as not valid for it:
/// 422 Invalid with the `WatchList` feature gate off, or 400 from a server that reads the
/// parameters otherwise.
fn refuses_watch_lists(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchStartFailed(kube::Error::Api(status))
        if status.code == 422 || status.code == 400)
}

/// What a watch says, in the terms of its consumer: keys `K` and the values `V` read from objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watched<K: Eq + Hash, V> {
    /// An object was listed, added or modified.
    Applied(K, V),
    /// An object was deleted.
    Deleted(K),
    /// A (re-)list ended: these are all the objects that exist now. Any other one known is gone
    /// (deleted while the watch was down).
    Relisted(HashSet<K>),
}

/// Turns a watch's events into [`Watched`]: `key` names an object (`None` skips it), `value`
/// reads what the consumer keeps of it.
pub struct Adapter<K, FK, FV> {
    /// The keys of the list in progress, from `Init` to `InitDone`.
    listing: Option<HashSet<K>>,
    key: FK,
    value: FV,
}

impl<K, FK, FV> Adapter<K, FK, FV>
where
    K: Eq + Hash + Clone,
{
    pub fn new(key: FK, value: FV) -> Self {
        Adapter {
            listing: None,
            key,
            value,
        }
    }

    /// One event in, at most one change out.
    pub fn feed<O, V>(&mut self, event: Event<O>) -> Option<Watched<K, V>>
    where
        FK: FnMut(&O) -> Option<K>,
        FV: FnMut(&K, O) -> V,
    {
        match event {
            Event::Init => {
                self.listing = Some(HashSet::new());
                None
            }
            Event::InitApply(obj) => {
                let key = (self.key)(&obj)?;
                if let Some(listing) = self.listing.as_mut() {
                    listing.insert(key.clone());
                }
                let value = (self.value)(&key, obj);
                Some(Watched::Applied(key, value))
            }
            Event::InitDone => Some(Watched::Relisted(self.listing.take().unwrap_or_default())),
            Event::Apply(obj) => {
                let key = (self.key)(&obj)?;
                let value = (self.value)(&key, obj);
                Some(Watched::Applied(key, value))
            }
            Event::Delete(obj) => (self.key)(&obj).map(Watched::Deleted),
        }
    }
}

/// A watch's changes: every event goes through `adapter`; errors (the watch goes on after
/// them, with backoff) go to `on_error`.
pub fn changes<O, K, V, FK, FV>(
    events: impl Stream<Item = Result<Event<O>, watcher::Error>>,
    mut adapter: Adapter<K, FK, FV>,
    mut on_error: impl FnMut(&watcher::Error),
) -> impl Stream<Item = Watched<K, V>>
where
    K: Eq + Hash + Clone,
    FK: FnMut(&O) -> Option<K>,
    FV: FnMut(&K, O) -> V,
{
    events.filter_map(move |event| {
        let change = match event {
            Ok(event) => adapter.feed(event),
            Err(e) => {
                on_error(&e);
                None
            }
        };
        std::future::ready(change)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Objects are (name, value); an empty name has no key.
    type Object = (&'static str, u32);

    fn adapter()
    -> Adapter<String, impl FnMut(&Object) -> Option<String>, impl FnMut(&String, Object) -> u32>
    {
        Adapter::new(
            |o: &Object| (!o.0.is_empty()).then(|| o.0.to_owned()),
            |_: &String, o: Object| o.1,
        )
    }

    #[test]
    fn a_list_ends_with_every_key_it_showed() {
        let mut a = adapter();
        assert_eq!(a.feed(Event::Init), None);
        assert_eq!(
            a.feed(Event::InitApply(("a", 1))),
            Some(Watched::Applied("a".to_owned(), 1))
        );
        assert_eq!(a.feed(Event::InitApply(("", 9))), None, "no key: skipped");
        a.feed(Event::InitApply(("b", 2)));
        assert_eq!(
            a.feed(Event::InitDone),
            Some(Watched::Relisted(HashSet::from([
                "a".to_owned(),
                "b".to_owned()
            ])))
        );
        assert_eq!(
            a.feed(Event::Apply(("c", 3))),
            Some(Watched::Applied("c".to_owned(), 3))
        );
        assert_eq!(
            a.feed(Event::Delete(("a", 1))),
            Some(Watched::Deleted("a".to_owned()))
        );
        // A re-list starts empty.
        a.feed(Event::Init);
        assert_eq!(
            a.feed(Event::InitDone),
            Some(Watched::Relisted(HashSet::new()))
        );
    }

    #[tokio::test]
    async fn a_stream_of_events_becomes_a_stream_of_changes() {
        let events = futures::stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply(("a", 1))),
            Err(watcher::Error::NoResourceVersion),
            Ok(Event::InitDone),
            Ok(Event::Apply(("b", 2))),
        ]);
        let mut errors = 0;
        let seen: Vec<_> = changes(events, adapter(), |_| errors += 1).collect().await;
        assert_eq!(
            seen,
            [
                Watched::Applied("a".to_owned(), 1),
                Watched::Relisted(HashSet::from(["a".to_owned()])),
                Watched::Applied("b".to_owned(), 2),
            ]
        );
        assert_eq!(errors, 1);
    }
}
