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
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

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
/// has it off). From the first of these on, this watch lists in pages, for as long as it lives,
/// with a log line and `lists.on_fallback` called once with the reason ([`Fallback`]):
/// - the server refuses the watch as invalid (422; servers before `sendInitialEvents` existed
///   reject its `resourceVersionMatch` the same way);
/// - a streaming list goes quiet for `lists.quiet` without the bookmark that ends it (a proxy
///   that drops `sendInitialEvents` or the bookmark): the list would never end;
/// - `lists.attempts` streaming lists in a row fail: each breaks before its bookmark (an error,
///   or the stream starts again from zero, kubernetes#138557), or its watch is over and a new
///   list begins within `lists.settled` of its bookmark with no change seen in between (the
///   watch closed right after the bookmark and could not be resumed, kubernetes#134837). Each
///   such list costs the API server a whole list: without a bound they would repeat for ever.
///
/// A watch closed after its bookmark that kube-runtime resumes from the bookmark's version (a
/// plain watch) costs no list and is no failure.
pub fn events<K>(
    api: Api<K>,
    paged: watcher::Config,
    lists: &StreamingLists,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + use<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let streaming: BoxStream<'static, _> =
        watcher::watcher(api.clone(), paged.clone().streaming_lists()).boxed();
    let resource = api.resource_url().to_owned();
    with_fallback(
        streaming,
        move || watcher::watcher(api, paged).boxed(),
        resource,
        lists.clone(),
    )
}

/// How long a streaming list may send nothing before its end: kube-apiserver sends the initial
/// events back to back from its watch cache and the bookmark right after them (after waiting up
/// to 3 s for the cache to be fresh), so a pause this long means the bookmark is not coming.
pub const INITIAL_EVENTS_QUIET: Duration = Duration::from_secs(30);

/// How many streaming lists in a row may fail before the watch lists in pages.
pub const STREAMING_LIST_ATTEMPTS: u32 = 3;

/// A new list that begins within this time of the last one's end bookmark, with no change seen
/// in between, counts the last one as failed: its watch did not last.
pub const STREAMING_LIST_SETTLED: Duration = Duration::from_secs(30);

/// Why a watch gave up streaming lists for paged ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// The API server refused them (the `WatchList` gate is off, or it predates them).
    Refused,
    /// A streaming list went quiet without its end bookmark.
    Quiet,
    /// Streaming lists broke before their end bookmark, again and again.
    Broken,
    /// Streaming lists ended, but their watches closed and were listed again, again and again.
    Closed,
}

impl Fallback {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Refused => "refused",
            Fallback::Quiet => "quiet",
            Fallback::Broken => "broken",
            Fallback::Closed => "closed_after_bookmark",
        }
    }
}

/// What is told when a watch gives up streaming lists.
pub type OnFallback = Arc<dyn Fn(Fallback) + Send + Sync>;

/// When [`events`] gives up streaming lists, and whom it tells.
#[derive(Clone)]
pub struct StreamingLists {
    /// See [`INITIAL_EVENTS_QUIET`].
    pub quiet: Duration,
    /// See [`STREAMING_LIST_ATTEMPTS`].
    pub attempts: u32,
    /// See [`STREAMING_LIST_SETTLED`].
    pub settled: Duration,
    /// Called once per watch that falls back (a metric).
    pub on_fallback: Option<OnFallback>,
}

impl Default for StreamingLists {
    fn default() -> Self {
        StreamingLists {
            quiet: INITIAL_EVENTS_QUIET,
            attempts: STREAMING_LIST_ATTEMPTS,
            settled: STREAMING_LIST_SETTLED,
            on_fallback: None,
        }
    }
}

impl StreamingLists {
    /// The defaults, telling `on_fallback`.
    pub fn telling(on_fallback: impl Fn(Fallback) + Send + Sync + 'static) -> Self {
        StreamingLists {
            on_fallback: Some(Arc::new(on_fallback)),
            ..Default::default()
        }
    }
}

impl Debug for StreamingLists {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamingLists")
            .field("quiet", &self.quiet)
            .field("attempts", &self.attempts)
            .field("settled", &self.settled)
            .finish_non_exhaustive()
    }
}

/// Where a watch is in its lists, for [`with_fallback`].
#[derive(Debug, Default)]
struct Attempts {
    /// A list has begun (Init) and not ended (InitDone).
    listing: bool,
    /// When the last list ended, while no change has been seen since.
    ended: Option<Instant>,
    /// Streaming lists that failed in a row.
    failed: u32,
}

impl Attempts {
    /// Takes in one event of the streaming watch; says when the lists failed too often.
    fn see<K>(
        &mut self,
        item: &Result<Event<K>, watcher::Error>,
        lists: &StreamingLists,
    ) -> Option<Fallback> {
        let failed = match item {
            Ok(Event::Init) => {
                let failed = match self.ended {
                    _ if self.listing => Some(Fallback::Broken),
                    Some(at) if at.elapsed() < lists.settled => Some(Fallback::Closed),
                    // The last list's watch lived: this list starts a new count.
                    Some(_) => {
                        self.failed = 0;
                        None
                    }
                    // The first list, or one after a failure already counted.
                    None => None,
                };
                self.listing = true;
                self.ended = None;
                failed
            }
            Ok(Event::InitApply(_)) => None,
            Ok(Event::InitDone) => {
                self.listing = false;
                self.ended = Some(Instant::now());
                None
            }
            Ok(Event::Apply(_) | Event::Delete(_)) => {
                // The watch after the list works.
                self.ended = None;
                self.failed = 0;
                None
            }
            // An error ends the list under way; the next begins with its own Init.
            Err(_) => std::mem::take(&mut self.listing).then_some(Fallback::Broken),
        };
        let reason = failed?;
        self.failed += 1;
        (self.failed >= lists.attempts.max(1)).then_some(reason)
    }
}

/// `streaming`, until it fails as [`events`] says; from then on `paged()`.
fn with_fallback<K, P>(
    streaming: BoxStream<'static, Result<Event<K>, watcher::Error>>,
    paged: P,
    resource: String,
    lists: StreamingLists,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + use<K, P>
where
    K: Send + 'static,
    P: FnOnce() -> BoxStream<'static, Result<Event<K>, watcher::Error>> + Send + 'static,
{
    // The paged watch to fall back to, until it is taken: while it is here, the lists stream.
    // What the watch carries from one event to the next: no copy per event.
    let state = (streaming, Some(paged), Attempts::default(), lists, resource);
    futures::stream::unfold(
        state,
        move |(mut events, mut fallback, mut attempts, lists, resource)| async move {
            loop {
                let next = if attempts.listing && fallback.is_some() {
                    match tokio::time::timeout(lists.quiet, events.next()).await {
                        Ok(next) => next,
                        Err(_) => {
                            let paged = fallback.take()?;
                            events = give_up(paged, Fallback::Quiet, 0, &resource, &lists);
                            attempts = Attempts::default();
                            continue;
                        }
                    }
                } else {
                    events.next().await
                };
                let item = next?;
                if fallback.is_some() {
                    let why = match &item {
                        Err(e) if refuses_watch_lists(e) => {
                            tracing::info!(
                                resource,
                                error = %crate::redact::watcher_error(e),
                                "the API server does not serve streaming lists; listing in pages"
                            );
                            Some(Fallback::Refused)
                        }
                        item => attempts.see(item, &lists),
                    };
                    if let Some(why) = why {
                        let paged = fallback.take()?;
                        events = give_up(paged, why, attempts.failed, &resource, &lists);
                        attempts = Attempts::default();
                        continue;
                    }
                }
                return Some((item, (events, fallback, attempts, lists, resource)));
            }
        },
    )
}

/// Says why a watch gives up streaming lists, and starts its paged watch.
fn give_up<K, P>(
    paged: P,
    why: Fallback,
    failed: u32,
    resource: &str,
    lists: &StreamingLists,
) -> BoxStream<'static, Result<Event<K>, watcher::Error>>
where
    P: FnOnce() -> BoxStream<'static, Result<Event<K>, watcher::Error>>,
{
    match why {
        // Said where the refusal is seen, with its error.
        Fallback::Refused => {}
        Fallback::Quiet => tracing::warn!(
            resource,
            quiet = ?lists.quiet,
            "a streaming list sent nothing for this long without the bookmark that ends it (a proxy in between?); listing in pages"
        ),
        Fallback::Broken | Fallback::Closed => tracing::warn!(
            resource,
            attempts = failed,
            reason = why.as_str(),
            "streaming lists failed this many times in a row; listing in pages"
        ),
    }
    if let Some(tell) = &lists.on_fallback {
        tell(why);
    }
    paged()
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

    type Item = Result<Event<Object>, watcher::Error>;

    /// What `with_fallback` passes on, and how often it fell back and why, for a streaming watch
    /// that sends `streaming` (then nothing: it hangs, as a watch does) and a paged one that
    /// lists `["p"]`. Time is paused: 10 ms pass before each streaming event, `gap` before each
    /// list's beginning.
    async fn run(streaming: Vec<Item>, gap: Duration) -> (Vec<String>, Vec<Fallback>) {
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let lists = StreamingLists {
            on_fallback: Some({
                let told = told.clone();
                Arc::new(move |why| told.lock().unwrap().push(why))
            }),
            ..Default::default()
        };
        let streaming = futures::stream::iter(streaming)
            .then(move |item| async move {
                let wait = match item {
                    Ok(Event::Init) => gap,
                    _ => Duration::from_millis(10),
                };
                tokio::time::sleep(wait).await;
                item
            })
            .chain(futures::stream::pending())
            .boxed();
        let paged = || {
            futures::stream::iter([
                Ok(Event::Init),
                Ok(Event::InitApply(("p", 0))),
                Ok(Event::InitDone),
            ])
            .chain(futures::stream::pending())
            .boxed()
        };
        let events = with_fallback(streaming, paged, "configmaps".to_owned(), lists);
        let mut events = std::pin::pin!(events);
        let mut seen = Vec::new();
        // Every test's stream settles within an hour of paused time.
        while let Ok(Some(item)) =
            tokio::time::timeout(Duration::from_secs(3600), events.next()).await
        {
            seen.push(match item {
                Ok(Event::Init) => "init".to_owned(),
                Ok(Event::InitApply((n, _))) => format!("list {n}"),
                Ok(Event::InitDone) => "done".to_owned(),
                Ok(Event::Apply((n, _))) => format!("apply {n}"),
                Ok(Event::Delete((n, _))) => format!("delete {n}"),
                Err(_) => "error".to_owned(),
            });
        }
        let told = told.lock().unwrap().clone();
        (seen, told)
    }

    fn list_of(name: &'static str) -> [Item; 3] {
        [
            Ok(Event::Init),
            Ok(Event::InitApply((name, 1))),
            Ok(Event::InitDone),
        ]
    }

    #[tokio::test(start_paused = true)]
    async fn streaming_lists_that_break_again_and_again_give_way_to_pages() {
        // Each list starts again from zero before its end bookmark (kubernetes#138557).
        let mut streaming = Vec::new();
        for _ in 0..10 {
            streaming.push(Ok(Event::Init));
            streaming.push(Ok(Event::InitApply(("a", 1))));
        }
        let (seen, told) = run(streaming, Duration::from_millis(10)).await;
        assert_eq!(told, [Fallback::Broken], "told once, with the reason");
        let streamed = seen.iter().filter(|e| *e == "list a").count();
        assert_eq!(streamed, 3, "three attempts, then pages: {seen:?}");
        assert_eq!(seen[seen.len() - 3..], ["init", "list p", "done"]);
    }

    #[tokio::test(start_paused = true)]
    async fn streaming_lists_that_break_with_errors_give_way_to_pages() {
        let mut streaming = Vec::new();
        for _ in 0..10 {
            streaming.push(Ok(Event::Init));
            streaming.push(Err(watcher::Error::NoResourceVersion));
        }
        let (seen, told) = run(streaming, Duration::from_millis(10)).await;
        assert_eq!(told, [Fallback::Broken]);
        assert_eq!(seen.iter().filter(|e| *e == "error").count(), 2);
        assert_eq!(seen.last().map(String::as_str), Some("done"));
    }

    #[tokio::test(start_paused = true)]
    async fn lists_whose_watches_close_after_the_bookmark_give_way_to_pages() {
        // Each list ends, but its watch is gone at once and the next list begins (410).
        let mut streaming = Vec::new();
        for _ in 0..10 {
            streaming.extend(list_of("a"));
            streaming.push(Err(watcher::Error::NoResourceVersion));
        }
        let (seen, told) = run(streaming, Duration::from_millis(10)).await;
        assert_eq!(told, [Fallback::Closed]);
        assert_eq!(seen.iter().filter(|e| *e == "done").count(), 4, "3 + pages");
        assert_eq!(seen[seen.len() - 3..], ["init", "list p", "done"]);
    }

    #[tokio::test(start_paused = true)]
    async fn lists_that_are_far_apart_or_followed_by_changes_are_no_failures() {
        // Relists a minute apart: a watch that lived, then expired as watches do.
        let mut streaming = Vec::new();
        for _ in 0..5 {
            streaming.extend(list_of("a"));
        }
        let (seen, told) = run(streaming, Duration::from_secs(60)).await;
        assert!(told.is_empty(), "{told:?}");
        assert!(!seen.contains(&"list p".to_owned()));

        // Relists close together, each after a change came through the watch.
        let mut streaming = Vec::new();
        for _ in 0..5 {
            streaming.extend(list_of("a"));
            streaming.push(Ok(Event::Apply(("b", 2))));
        }
        let (seen, told) = run(streaming, Duration::from_millis(10)).await;
        assert!(told.is_empty(), "{told:?}");
        assert_eq!(seen.iter().filter(|e| *e == "apply b").count(), 5);

        // Two broken lists, then one that works: the count starts again.
        let mut streaming = vec![Ok(Event::Init), Ok(Event::Init)];
        streaming.extend(list_of("a"));
        streaming.push(Ok(Event::Apply(("b", 2))));
        streaming.extend([Ok(Event::Init), Ok(Event::Init)]);
        streaming.extend(list_of("a"));
        let (_, told) = run(streaming, Duration::from_millis(10)).await;
        assert!(told.is_empty(), "{told:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_streaming_list_that_goes_quiet_gives_way_to_pages() {
        let (seen, told) = run(
            vec![Ok(Event::Init), Ok(Event::InitApply(("a", 1)))],
            Duration::from_millis(10),
        )
        .await;
        assert_eq!(told, [Fallback::Quiet]);
        assert_eq!(seen, ["init", "list a", "init", "list p", "done"]);
    }
}
