//! Reading a workload's references: every object under one deadline, within shared bounds.
//!
//! NotFound is "absent", not an error. Any other error, or the deadline passing, fails the whole
//! lookup (stamp rule 1), because a stamp computed from part of the inputs would be wrong.
//!
//! Anyone who reaches the webhook's port can send a review, so what a review can make this module
//! do is bounded:
//! - a namespace and every name go into a URL only once they are valid Kubernetes names
//!   ([`object_path`]): the client library formats paths without escaping;
//! - a review reads at most [`MAX_CONCURRENT_READS`] objects at once, and all reviews together
//!   at most [`Lookups`]' cap, handed out in turn across reviews ([`Fair`]), so a flood of
//!   large reviews cannot starve a small one;
//! - the bytes of every object read count against the webhook's [`MemoryBudget`] while they are
//!   read and decoded; only per-key digests are kept afterwards;
//! - an object's content never reaches an error message or a log line: errors name the object and
//!   say what was wrong, never quote the answer.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::sync::OwnedSemaphorePermit;

use crate::budget::{
    Class, Fair, HEAVY_AFTER_BYTES, LARGE_ANSWER_BYTES, MAX_OBJECT_BYTES, MemoryBudget,
};
use confighash_cluster::get::{GetBody, Getter};
use confighash_core::checksum::{ObjectDigest, RecipeError, RefState, StampKey, Tag, ValueDigest};
use confighash_core::record::{self, ObjectRecord};
use confighash_core::refs::{self, ObjectKind, ObjectRef, References};
use confighash_core::rules::{self, Lookup};
use confighash_metrics::Metrics;

/// A referenced object as a [`ObjectSource`] found it.
#[derive(Debug, Clone)]
pub enum Fetched {
    ConfigMap(ConfigMap),
    Secret(Secret),
    /// Already reduced to what the recipe needs.
    Entry(ObjectRecord),
}

impl Fetched {
    fn into_entry(self) -> Result<ObjectRecord, RecipeError> {
        match self {
            Fetched::ConfigMap(cm) => ObjectRecord::config_map(&cm),
            Fetched::Secret(s) => Ok(ObjectRecord::secret(&s)),
            Fetched::Entry(e) => Ok(e),
        }
    }
}

/// Why a lookup failed. No variant carries an object's content.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    #[error("reading {object}: {error}")]
    Read { object: ObjectRef, error: ReadError },
    #[error("the lookup deadline of {0:?} passed")]
    Deadline(Duration),
    #[error(
        "the references hold at least {bytes} bytes of values, more than {max} (--max-reference-bytes)"
    )]
    TooLarge { bytes: u64, max: u64 },
    #[error(transparent)]
    Recipe(#[from] RecipeError),
}

/// Why one referenced object could not be read: what went wrong and where, made of what
/// confighash knows (a status code, a bound, a JSON position, the object's name and key names).
/// No variant holds anything an answer's body held, so a read error cannot quote content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Path(#[from] PathError),
    /// The request or the reading of its answer failed: the transport's error, which carries no
    /// answer body.
    #[error("the request failed: {0}")]
    Request(String),
    /// The API server answered this status; its body was not read.
    #[error("the API server answered {0}")]
    Status(http::StatusCode),
    #[error("the answer is larger than {MAX_OBJECT_BYTES} bytes")]
    TooLarge,
    #[error("the answer does not fit in the webhook's memory budget")]
    NoRoom,
    #[error("the answer is not a {kind}: {place}")]
    NotJson {
        kind: &'static str,
        place: confighash_core::json::ErrorPlace,
    },
    #[error("the answer is not a {0} but another kind")]
    OtherKind(&'static str),
    #[error("a value of {0} is not valid base64")]
    Base64(ObjectRef),
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    /// A source of its own (tests, the fuzz checks) refused the read, for this fixed reason.
    #[error("{0}")]
    Refused(&'static str),
}

/// Where referenced objects are read from.
pub trait ObjectSource: Send + Sync + 'static {
    /// The object, `None` when it does not exist. Bytes read along the way are taken from
    /// `budget` while they are held.
    fn fetch<'a>(
        &'a self,
        namespace: &'a str,
        object: &'a ObjectRef,
        budget: &'a MemoryBudget,
    ) -> BoxFuture<'a, Result<Option<Fetched>, ReadError>>;
}

/// Why a name cannot go into a request path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the namespace is not a valid namespace name (a DNS-1123 label)")]
    Namespace,
    #[error("the name is not a valid ConfigMap or Secret name (a DNS-1123 subdomain)")]
    Name,
}

/// The API path of a ConfigMap or Secret, built only from valid names: a namespace is a DNS-1123
/// label and an object name a DNS-1123 subdomain, so neither can hold `/`, `?`, `%` or `..`.
/// Every lookup path is built here.
pub fn object_path(namespace: &str, object: &ObjectRef) -> Result<String, PathError> {
    if !refs::is_namespace_name(namespace) {
        return Err(PathError::Namespace);
    }
    if !refs::is_object_name(&object.name) {
        return Err(PathError::Name);
    }
    let plural = match object.kind {
        ObjectKind::ConfigMap => "configmaps",
        ObjectKind::Secret => "secrets",
    };
    Ok(format!(
        "/api/v1/namespaces/{namespace}/{plural}/{}",
        object.name
    ))
}

/// Reads straight from the API server. A get without a resourceVersion is a consistent (quorum)
/// read, so a ConfigMap written just before its Deployment is seen.
///
/// The answer is read by hand, through [`Getter`], rather than through `kube::Api`: the client
/// library logs a body it cannot parse (at WARN) and error bodies (at DEBUG), and either can hold
/// Secret data. Here the body is decoded into the few fields the recipe needs, each value hashed
/// as it is decoded, and errors say only what was wrong.
pub struct KubeSource {
    getter: Getter,
}

impl KubeSource {
    pub fn new(getter: Getter) -> Self {
        KubeSource { getter }
    }

    async fn get(
        &self,
        namespace: &str,
        object: &ObjectRef,
        budget: &MemoryBudget,
    ) -> Result<Option<Fetched>, ReadError> {
        let path = object_path(namespace, object)?;
        let response =
            (self.getter.get(&path).await).map_err(|e| ReadError::Request(e.to_string()))?;
        let status = response.status();
        if status == http::StatusCode::NOT_FOUND {
            // Its body (a Status) is read to its end, unquoted, so the connection serves again.
            discard(response.into_body()).await;
            return Ok(None);
        }
        if !status.is_success() {
            // The body (a Status, or anything a proxy sends) is not read: its message can quote
            // object content.
            return Err(ReadError::Status(status));
        }
        let declared = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let (body, _held) = read_limited(response.into_body(), declared, budget).await?;
        decode_object(object, &body).map(|e| Some(Fetched::Entry(e)))
    }
}

/// The largest body [`discard`] reads to keep its connection; a larger one closes it.
const MAX_DISCARDED_BYTES: usize = 16 * 1024;

/// Reads a body to its end and drops what it held, up to [`MAX_DISCARDED_BYTES`].
async fn discard(mut body: GetBody) {
    let mut read = 0;
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            read += data.len();
            if read > MAX_DISCARDED_BYTES {
                return;
            }
        }
    }
}

impl ObjectSource for KubeSource {
    fn fetch<'a>(
        &'a self,
        namespace: &'a str,
        object: &'a ObjectRef,
        budget: &'a MemoryBudget,
    ) -> BoxFuture<'a, Result<Option<Fetched>, ReadError>> {
        Box::pin(self.get(namespace, object, budget))
    }
}

/// What an answer holds of the budget while it is read and decoded: its bytes, and for a large
/// answer its place among [`LARGE_ANSWERS_AT_ONCE`](crate::budget::LARGE_ANSWERS_AT_ONCE).
type Permits = (Option<OwnedSemaphorePermit>, Option<OwnedSemaphorePermit>);

/// An answer's body, at most [`MAX_OBJECT_BYTES`], its buffer taken from `budget` as it grows
/// (twice over: decoding may copy strings that hold escapes); past [`LARGE_ANSWER_BYTES`] it
/// waits for a place among the large answers first.
async fn read_limited<B>(
    mut body: B,
    declared: Option<u64>,
    budget: &MemoryBudget,
) -> Result<(Vec<u8>, Permits), ReadError>
where
    B: hyper::body::Body<Data = hyper::body::Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    if declared.is_some_and(|n| n > MAX_OBJECT_BYTES as u64) {
        return Err(ReadError::TooLarge);
    }
    let mut held: Option<OwnedSemaphorePermit> = None;
    let mut large: Option<OwnedSemaphorePermit> = None;
    let mut buf: Vec<u8> = Vec::new();
    let initial = declared.map_or(16 * 1024, |n| n as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Request(format!("reading the answer: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let needed = buf.len() + data.len();
        if needed > MAX_OBJECT_BYTES {
            return Err(ReadError::TooLarge);
        }
        if needed > buf.capacity() {
            let capacity = needed
                .max(buf.capacity() * 2)
                .max(initial)
                .min(MAX_OBJECT_BYTES);
            if capacity > LARGE_ANSWER_BYTES && large.is_none() {
                large = Some(budget.large_answer().await.ok_or(ReadError::NoRoom)?);
            }
            let more = budget
                .reserve(2 * (capacity - buf.capacity()))
                .await
                .ok_or(ReadError::NoRoom)?;
            match held.as_mut() {
                Some(h) => h.merge(more),
                None => held = Some(more),
            }
            buf.reserve_exact(capacity - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    // Both held until the answer is decoded.
    Ok((buf, (held, large)))
}

/// A string that borrows from the input where it holds no escapes.
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// The few fields of a ConfigMap or Secret the recipe reads; every other field is skipped.
struct LeanObject<'a> {
    kind: Option<Text<'a>>,
    metadata: Option<LeanMeta<'a>>,
    data: Option<Vec<(Text<'a>, Text<'a>)>>,
    binary_data: Option<Vec<(Text<'a>, Text<'a>)>>,
}

struct LeanMeta<'a> {
    annotations: Option<Vec<(Text<'a>, Text<'a>)>>,
}

/// A JSON object read as its members in order (duplicates kept; the last one wins later).
mod members {
    use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
    use std::marker::PhantomData;

    pub struct Members<K, V>(pub Vec<(K, V)>);

    impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for Members<K, V> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V_<K, V>(PhantomData<(K, V)>);
            impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> Visitor<'de> for V_<K, V> {
                type Value = Members<K, V>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a map of strings")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                    let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(1024));
                    while let Some(entry) = map.next_entry()? {
                        out.push(entry);
                    }
                    Ok(Members(out))
                }
            }
            d.deserialize_map(V_(PhantomData))
        }
    }
}

/// Decodes an answer into the object's entry. Errors say what is wrong and where, never what
/// the answer holds.
fn decode_object(object: &ObjectRef, body: &[u8]) -> Result<ObjectRecord, ReadError> {
    let lean: LeanBody<'_> = serde_json::from_slice(body).map_err(|e| ReadError::NotJson {
        kind: object.kind.as_str(),
        place: confighash_core::json::ErrorPlace::of(&e),
    })?;
    let lean = lean.0;
    if let Some(kind) = &lean.kind
        && kind.0 != object.kind.as_str()
    {
        return Err(ReadError::OtherKind(object.kind.as_str()));
    }
    let ignored = lean
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .is_some_and(|a| {
            // The last of duplicate members wins, as in the API server's decoding.
            a.iter()
                .rev()
                .find(|(k, _)| k.0 == confighash_core::names::IGNORE_ANNOTATION)
                .is_some_and(|(_, v)| v.0 == "true")
        });
    if ignored {
        return Ok(ObjectRecord::ignored());
    }
    // Each value's digest and decoded length; a key given twice keeps the last, as the API
    // server's decoding does.
    let base64_value = |v: &str| -> Result<(ValueDigest, u64), ReadError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v)
            .map_err(|_| ReadError::Base64(object.clone()))?;
        Ok((Sha256::digest(&bytes).into(), bytes.len() as u64))
    };
    let mut entries: BTreeMap<&str, (Tag, ValueDigest, u64)> = BTreeMap::new();
    for (k, v) in lean.data.iter().flatten() {
        let (digest, len) = match object.kind {
            ObjectKind::ConfigMap => (Sha256::digest(v.0.as_bytes()).into(), v.0.len() as u64),
            ObjectKind::Secret => base64_value(&v.0)?,
        };
        entries.insert(&k.0, (Tag::Data, digest, len));
    }
    if object.kind == ObjectKind::ConfigMap {
        let mut binary: BTreeMap<&str, (ValueDigest, u64)> = BTreeMap::new();
        for (k, v) in lean.binary_data.iter().flatten() {
            binary.insert(&k.0, base64_value(&v.0)?);
        }
        for (k, (digest, len)) in binary {
            if entries.contains_key(k) {
                return Err(RecipeError::DuplicateKey {
                    name: object.name.clone(),
                    key: k.to_owned(),
                }
                .into());
            }
            entries.insert(k, (Tag::BinaryData, digest, len));
        }
    }
    let bytes = entries.values().map(|e| e.2).sum();
    Ok(ObjectRecord {
        ignored: false,
        digest: ObjectDigest::from_digests(
            entries
                .into_iter()
                .map(|(k, (t, d, _))| (k.to_owned(), t, d)),
        )
        .with_bytes(bytes),
    })
}

/// [`LeanObject`] with its maps read as member lists.
struct LeanBody<'a>(LeanObject<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for LeanBody<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Raw<'a> {
            #[serde(borrow, default)]
            kind: Option<Text<'a>>,
            #[serde(borrow, default)]
            metadata: Option<RawMeta<'a>>,
            #[serde(borrow, default)]
            data: Option<members::Members<Text<'a>, Text<'a>>>,
            #[serde(borrow, default, rename = "binaryData")]
            binary_data: Option<members::Members<Text<'a>, Text<'a>>>,
        }
        #[derive(Deserialize)]
        struct RawMeta<'a> {
            #[serde(borrow, default)]
            annotations: Option<members::Members<Text<'a>, Text<'a>>>,
        }
        let raw = Raw::deserialize(d)?;
        Ok(LeanBody(LeanObject {
            kind: raw.kind,
            metadata: raw.metadata.map(|m| LeanMeta {
                annotations: m.annotations.map(|a| a.0),
            }),
            data: raw.data.map(|m| m.0),
            binary_data: raw.binary_data.map(|m| m.0),
        }))
    }
}

/// The decoded bytes of an object's values, as `--max-reference-bytes` counts them (none for an
/// ignored object).
fn record_bytes(record: &ObjectRecord) -> u64 {
    match record::state_of(Some(record)) {
        RefState::Present(entries) => entries.bytes(),
        RefState::Absent | RefState::Ignored => 0,
    }
}

/// Every referenced object, read.
#[derive(Debug, Default)]
pub struct Resolved {
    objects: BTreeMap<ObjectRef, Option<ObjectRecord>>,
}

impl Resolved {
    /// Required references that do not exist.
    pub fn absent_required<'r>(
        &'r self,
        refs: &'r References,
    ) -> impl Iterator<Item = &'r ObjectRef> {
        refs.iter()
            .filter(|(r, spec)| !spec.optional && matches!(self.objects.get(*r), Some(None)))
            .map(|(r, _)| r)
    }

    /// The rules' view of this lookup ([`rules::expected`]); the expected v1 stamp only when
    /// `with_v1` (see [`rules::needs_v1`]).
    pub fn lookup(
        &self,
        key: &StampKey,
        namespace: &str,
        refs: &References,
        with_v1: bool,
        max_bytes: u64,
    ) -> Lookup {
        rules::expected(self, Some(key), namespace, refs, with_v1, max_bytes)
    }
}

impl rules::View for Resolved {
    fn state(&self, object: &ObjectRef) -> RefState<'_> {
        record::state_of(self.objects.get(object).and_then(Option::as_ref))
    }
}

/// Reads one review keeps in flight at most. A pod naming many objects is read a few at a time
/// within the same deadline, not all at once against the API server.
pub const MAX_CONCURRENT_READS: usize = 16;

/// The default cap on reads in flight for all reviews together. At 1,000 reviews/s of 10
/// references each, 32 places held reviews back whenever a GET took more than 3 ms (32 divided
/// by the latency is the most reads per second): on a busy node the queue then grew faster than
/// it drained, and reviews were refused for memory (BENCHMARKS.md section 11).
pub const DEFAULT_MAX_READS_IN_FLIGHT: usize = 128;

/// Where reviews read their references from, and the cap they share.
pub struct Lookups {
    source: Arc<dyn ObjectSource>,
    fair: Arc<Fair>,
    next_review: AtomicU64,
}

impl Lookups {
    /// At most `max_in_flight` reads from `source` at once, all reviews together.
    pub fn new(source: Arc<dyn ObjectSource>, max_in_flight: usize) -> Self {
        Lookups {
            source,
            fair: Fair::new(max_in_flight),
            next_review: AtomicU64::new(0),
        }
    }

    /// The same source with another cap.
    pub fn with_cap(self, max_in_flight: usize) -> Self {
        Lookups::new(self.source, max_in_flight)
    }

    /// Reads every reference of a workload in `namespace`, a few at a time, within `deadline`,
    /// and stops once their values hold more than `max_bytes` ([`LookupError::TooLarge`]). Once
    /// they hold [`HEAVY_AFTER_BYTES`], the remaining reads queue behind other reviews' reads.
    pub async fn resolve(
        &self,
        namespace: &str,
        refs: &References,
        deadline: Duration,
        metrics: &Metrics,
        budget: &MemoryBudget,
        max_bytes: u64,
    ) -> Result<Resolved, LookupError> {
        let review = self.next_review.fetch_add(1, Ordering::Relaxed);
        let read_bytes = AtomicU64::new(0);
        let read_bytes = &read_bytes;
        type Read<'a> = BoxFuture<'a, (&'a ObjectRef, Result<Option<ObjectRecord>, ReadError>)>;
        let reads: Vec<Read<'_>> = refs
            .iter()
            .map(|(r, _)| -> Read<'_> {
                Box::pin(async move {
                    let class = if read_bytes.load(Ordering::Relaxed) >= HEAVY_AFTER_BYTES {
                        Class::Heavy
                    } else {
                        Class::Normal
                    };
                    let _place = self.fair.acquire(review, class).await;
                    let found = self.source.fetch(namespace, r, budget).await.and_then(|f| {
                        f.map(|f| f.into_entry().map_err(ReadError::from))
                            .transpose()
                    });
                    if let Ok(Some(record)) = &found {
                        read_bytes.fetch_add(record_bytes(record), Ordering::Relaxed);
                    }
                    (r, found)
                })
            })
            .collect();
        let mut reads = futures::stream::iter(reads).buffer_unordered(MAX_CONCURRENT_READS);
        let mut resolved = Resolved::default();
        let mut failure = None;
        let mut total: u64 = 0;
        let collect = async {
            while let Some((r, result)) = reads.next().await {
                match result {
                    Ok(found) => {
                        metrics.lookup(
                            r.kind.as_str(),
                            if found.is_some() { "found" } else { "absent" },
                        );
                        total = total.saturating_add(found.as_ref().map_or(0, record_bytes));
                        resolved.objects.insert(r.clone(), found);
                        if total > max_bytes {
                            // The reads still in flight or not started are dropped.
                            return Err(LookupError::TooLarge {
                                bytes: total,
                                max: max_bytes,
                            });
                        }
                    }
                    Err(error) => {
                        metrics.lookup(r.kind.as_str(), "error");
                        failure.get_or_insert(LookupError::Read {
                            object: r.clone(),
                            error,
                        });
                    }
                }
            }
            Ok(())
        };
        match tokio::time::timeout(deadline, collect).await {
            Err(_) => {
                for (r, _) in refs.iter() {
                    if !resolved.objects.contains_key(r) {
                        metrics.lookup(r.kind.as_str(), "deadline");
                    }
                }
                Err(LookupError::Deadline(deadline))
            }
            Ok(Err(too_large)) => Err(too_large),
            Ok(Ok(())) => match failure {
                Some(e) => Err(e),
                None => Ok(resolved),
            },
        }
    }

    /// Places under the shared cap free now.
    pub fn places_free(&self) -> usize {
        self.fair.available()
    }
}

#[cfg(test)]
mod tests;
