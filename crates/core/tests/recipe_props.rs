//! Property tests of checksum recipes v2 and v1 (docs/recipe.md).
//!
//! Every stamp here is computed four ways, under both recipes, and the four must agree: from whole
//! objects ([`ObjectView`]), from per-key digests of those views ([`ObjectDigest::from_view`]),
//! from digests this file computes itself with `sha2` ([`ObjectDigest::from_digests`]), and by an
//! independent implementation of the recipe as docs/recipe.md words it ([`reference_stamp`]),
//! which works on a structured form of the message ([`Tok`]) so that "two inputs give the same
//! message" can be decided without trusting the encoding. The properties are stated for v2, the
//! recipe stamps are made with.

use std::collections::{BTreeMap, BTreeSet};

use confighash_core::checksum::{
    self, MIN_KEY_LEN, ObjectDigest, ObjectView, Recipe, RefState, Stamp, StampKey, Tag,
};
use confighash_core::names::IGNORE_ANNOTATION;
use confighash_core::refs::{ObjectKind, ObjectRef, References, Selection};
use hmac::{Hmac, Mac};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::collection::{btree_map, btree_set, vec};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use sha2::{Digest, Sha256};

const CM: ObjectKind = ObjectKind::ConfigMap;
const SECRET: ObjectKind = ObjectKind::Secret;

// ---------------------------------------------------------------------------------------------
// The model: referenced objects and their entries, independent of k8s-openapi types
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Absent,
    Present,
    /// Present, annotated `confighash.dev/ignore: "true"`.
    Ignored,
}

type EntryMap = BTreeMap<String, (Tag, Vec<u8>)>;

#[derive(Debug, Clone)]
struct Obj {
    kind: ObjectKind,
    name: String,
    state: State,
    entries: EntryMap,
    /// The references to this object, in the order they are added (empty: unreferenced).
    adds: Vec<(Selection, bool)>,
}

impl Obj {
    fn oref(&self) -> ObjectRef {
        ObjectRef::new(self.kind, self.name.clone())
    }

    /// Secrets have only `data`; a ConfigMap's `data` holds UTF-8.
    fn normalize(mut self) -> Self {
        for (tag, value) in self.entries.values_mut() {
            match (self.kind, *tag) {
                (ObjectKind::Secret, _) => *tag = Tag::Data,
                (ObjectKind::ConfigMap, Tag::Data) => {
                    *value = String::from_utf8_lossy(value).into_owned().into_bytes();
                }
                (ObjectKind::ConfigMap, Tag::BinaryData) => {}
            }
        }
        self
    }

    /// The merged selection, computed here without `References`.
    fn selection(&self) -> Option<Selection> {
        let mut merged: Option<Selection> = None;
        for (sel, _) in &self.adds {
            merged = Some(match (merged, sel) {
                (Some(Selection::Whole), _) | (_, Selection::Whole) => Selection::Whole,
                (None, Selection::Keys(k)) => Selection::Keys(k.clone()),
                (Some(Selection::Keys(mut a)), Selection::Keys(b)) => {
                    a.extend(b.iter().cloned());
                    Selection::Keys(a)
                }
            });
        }
        merged
    }
}

/// Objects with distinct (kind, name), referenced by a workload in `namespace`.
#[derive(Debug, Clone)]
struct World {
    namespace: String,
    objs: Vec<Obj>,
}

impl World {
    fn new(objs: impl IntoIterator<Item = Obj>) -> Self {
        World::in_namespace("default", objs)
    }

    fn in_namespace(namespace: &str, objs: impl IntoIterator<Item = Obj>) -> Self {
        let mut seen = BTreeSet::new();
        World {
            namespace: namespace.to_owned(),
            objs: objs
                .into_iter()
                .map(Obj::normalize)
                .filter(|o| !o.name.is_empty() && seen.insert(o.oref()))
                .collect(),
        }
    }

    /// Every reference, object by object, in the order they are added.
    fn adds(&self) -> Vec<(ObjectKind, String, Selection, bool)> {
        self.objs
            .iter()
            .flat_map(|o| {
                o.adds
                    .iter()
                    .map(|(s, opt)| (o.kind, o.name.clone(), s.clone(), *opt))
            })
            .collect()
    }

    fn references(&self) -> References {
        references(&self.adds())
    }

    fn with(mut self, obj: Obj) -> Self {
        self.objs.retain(|o| o.oref() != obj.oref());
        self.objs.push(obj.normalize());
        self
    }
}

fn references(adds: &[(ObjectKind, String, Selection, bool)]) -> References {
    let mut refs = References::default();
    for (kind, name, sel, optional) in adds {
        refs.add(*kind, name, sel.clone(), *optional);
    }
    refs
}

// ---------------------------------------------------------------------------------------------
// An independent implementation of the recipe, on a structured message
// ---------------------------------------------------------------------------------------------

/// One part of the message, before encoding. Values are kept whole (not hashed), so equal token
/// lists mean equal inputs to the recipe and nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    /// v2 only: the workload's namespace, after the header.
    Namespace(String),
    Object(&'static str, String),
    Absent,
    /// v2 only: a key an absent object's key selection names, after `Absent`.
    SelectedKey(String),
    Present,
    Entry(&'static str, String, Vec<u8>),
    AbsentKey(String),
}

fn tag_str(tag: Tag) -> &'static str {
    match tag {
        Tag::Data => "data",
        Tag::BinaryData => "binaryData",
    }
}

fn kind_str(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::ConfigMap => "ConfigMap",
        ObjectKind::Secret => "Secret",
    }
}

fn tokens(world: &World, recipe: Recipe) -> Vec<Tok> {
    let mut objs: Vec<&Obj> = world.objs.iter().filter(|o| !o.adds.is_empty()).collect();
    // (kind, name) as bytes: "ConfigMap" < "Secret".
    objs.sort_by(|a, b| {
        (kind_str(a.kind).as_bytes(), a.name.as_bytes())
            .cmp(&(kind_str(b.kind).as_bytes(), b.name.as_bytes()))
    });
    let mut out = Vec::new();
    if recipe == Recipe::V2 {
        out.push(Tok::Namespace(world.namespace.clone()));
    }
    for o in objs {
        if o.state == State::Ignored {
            continue;
        }
        out.push(Tok::Object(kind_str(o.kind), o.name.clone()));
        if o.state == State::Absent {
            out.push(Tok::Absent);
            if let (Recipe::V2, Some(Selection::Keys(keys))) = (recipe, o.selection()) {
                let mut keys: Vec<String> = keys.into_iter().collect();
                keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
                out.extend(keys.into_iter().map(Tok::SelectedKey));
            }
            continue;
        }
        out.push(Tok::Present);
        match o.selection().expect("referenced") {
            Selection::Whole => {
                let mut entries: Vec<(&String, &Tag, &Vec<u8>)> =
                    o.entries.iter().map(|(k, (t, v))| (k, t, v)).collect();
                entries.sort_by(|a, b| {
                    (a.0.as_bytes(), tag_str(*a.1).as_bytes())
                        .cmp(&(b.0.as_bytes(), tag_str(*b.1).as_bytes()))
                });
                for (k, t, v) in entries {
                    out.push(Tok::Entry(tag_str(*t), k.clone(), v.clone()));
                }
            }
            Selection::Keys(keys) => {
                let mut keys: Vec<&String> = keys.iter().collect();
                keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
                for k in keys {
                    match o.entries.get(k) {
                        Some((t, v)) => out.push(Tok::Entry(tag_str(*t), k.clone(), v.clone())),
                        None => out.push(Tok::AbsentKey(k.clone())),
                    }
                }
            }
        }
    }
    out
}

fn lp(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn message(toks: &[Tok], recipe: Recipe) -> Vec<u8> {
    let mut m = Vec::new();
    match recipe {
        Recipe::V1 => lp(&mut m, b"confighash-recipe-v1"),
        Recipe::V2 => lp(&mut m, b"confighash-recipe-v2"),
    }
    for t in toks {
        match t {
            Tok::Namespace(ns) => lp(&mut m, ns.as_bytes()),
            Tok::SelectedKey(key) => lp(&mut m, key.as_bytes()),
            Tok::Object(kind, name) => {
                lp(&mut m, kind.as_bytes());
                lp(&mut m, name.as_bytes());
            }
            Tok::Absent => lp(&mut m, b"absent"),
            Tok::Present => lp(&mut m, b"present"),
            Tok::Entry(tag, key, value) => {
                lp(&mut m, tag.as_bytes());
                lp(&mut m, key.as_bytes());
                lp(&mut m, &Sha256::digest(value));
            }
            Tok::AbsentKey(key) => {
                lp(&mut m, b"absent-key");
                lp(&mut m, key.as_bytes());
            }
        }
    }
    m
}

fn reference_stamp(key: Option<&[u8]>, world: &World, recipe: Recipe) -> String {
    let m = message(&tokens(world, recipe), recipe);
    let version = match recipe {
        Recipe::V1 => "v1",
        Recipe::V2 => "v2",
    };
    match key {
        None => format!("{version}:plain:{}", hex::encode(Sha256::digest(&m))),
        Some(k) => {
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(k).unwrap();
            mac.update(&m);
            format!(
                "{version}:{}:{}",
                &hex::encode(Sha256::digest(k))[..8],
                hex::encode(mac.finalize().into_bytes())
            )
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes objects built from the model, and the stamp computed every way
// ---------------------------------------------------------------------------------------------

/// Metadata and representation details that must never enter the message.
#[derive(Debug, Clone, Default)]
struct Meta {
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    resource_version: Option<String>,
    uid: Option<String>,
    immutable: Option<bool>,
    type_: Option<String>,
    /// `Some({})` rather than `None` for empty maps.
    empty_maps: bool,
}

enum K8s {
    Cm(ConfigMap),
    Secret(Secret),
}

impl K8s {
    fn annotations(&self) -> Option<&BTreeMap<String, String>> {
        match self {
            K8s::Cm(c) => c.metadata.annotations.as_ref(),
            K8s::Secret(s) => s.metadata.annotations.as_ref(),
        }
    }

    fn view(&self) -> ObjectView<'_> {
        match self {
            K8s::Cm(c) => ObjectView::config_map(c).expect("no key in both data and binaryData"),
            K8s::Secret(s) => ObjectView::secret(s),
        }
    }
}

fn map_or_none<K: Ord, V>(m: BTreeMap<K, V>, keep_empty: bool) -> Option<BTreeMap<K, V>> {
    (keep_empty || !m.is_empty()).then_some(m)
}

/// The object as the API server would return it, its maps filled in `order`.
fn build(o: &Obj, meta: &Meta, order: &[(String, Tag, Vec<u8>)]) -> Option<K8s> {
    if o.state == State::Absent {
        return None;
    }
    let mut annotations = meta.annotations.clone();
    if o.state == State::Ignored {
        annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(IGNORE_ANNOTATION.to_owned(), "true".to_owned());
    }
    let metadata = ObjectMeta {
        name: Some(o.name.clone()),
        namespace: meta.namespace.clone(),
        labels: meta.labels.clone(),
        annotations,
        resource_version: meta.resource_version.clone(),
        uid: meta.uid.clone(),
        ..Default::default()
    };
    Some(match o.kind {
        ObjectKind::ConfigMap => {
            let mut data = BTreeMap::new();
            let mut binary = BTreeMap::new();
            for (k, t, v) in order {
                match t {
                    Tag::Data => {
                        data.insert(k.clone(), String::from_utf8(v.clone()).unwrap());
                    }
                    Tag::BinaryData => {
                        binary.insert(k.clone(), ByteString(v.clone()));
                    }
                }
            }
            K8s::Cm(ConfigMap {
                metadata,
                data: map_or_none(data, meta.empty_maps),
                binary_data: map_or_none(binary, meta.empty_maps),
                immutable: meta.immutable,
            })
        }
        ObjectKind::Secret => K8s::Secret(Secret {
            metadata,
            data: map_or_none(
                order
                    .iter()
                    .map(|(k, _, v)| (k.clone(), ByteString(v.clone())))
                    .collect(),
                meta.empty_maps,
            ),
            immutable: meta.immutable,
            type_: meta.type_.clone(),
            string_data: None,
        }),
    })
}

fn entry_list(o: &Obj) -> Vec<(String, Tag, Vec<u8>)> {
    o.entries
        .iter()
        .map(|(k, (t, v))| (k.clone(), *t, v.clone()))
        .collect()
}

/// Every existing object, with `metas[i]` for object `i` (default metadata when missing).
fn objects(world: &World, metas: &[Meta]) -> BTreeMap<ObjectRef, K8s> {
    let default = Meta::default();
    world
        .objs
        .iter()
        .enumerate()
        .filter_map(|(i, o)| {
            let meta = metas.get(i).unwrap_or(&default);
            build(o, meta, &entry_list(o)).map(|k| (o.oref(), k))
        })
        .collect()
}

#[derive(Debug)]
struct Stamps {
    views: Stamp,
    from_view: Stamp,
    from_digests: Stamp,
    reference: String,
}

/// The crate's stamp under `recipe` (v1 has no namespace).
fn compute<'s>(
    recipe: Recipe,
    key: Option<&StampKey>,
    namespace: &str,
    refs: &References,
    state: impl FnMut(&ObjectRef) -> RefState<'s>,
) -> Stamp {
    match recipe {
        Recipe::V1 => checksum::compute_stamp_v1(key, refs, state),
        Recipe::V2 => checksum::compute_stamp(key, namespace, refs, state),
    }
}

/// The v2 stamp of `refs` over `objs` in the world's namespace, every way this file knows.
fn stamps(
    key: Option<&[u8]>,
    refs: &References,
    world: &World,
    objs: &BTreeMap<ObjectRef, K8s>,
) -> Stamps {
    stamps_with(Recipe::V2, key, refs, world, objs)
}

/// [`stamps`] under `recipe`.
fn stamps_with(
    recipe: Recipe,
    key: Option<&[u8]>,
    refs: &References,
    world: &World,
    objs: &BTreeMap<ObjectRef, K8s>,
) -> Stamps {
    let stamp_key = key.map(|k| StampKey::new(k.to_vec()).unwrap());
    let stamp_key = stamp_key.as_ref();
    let namespace = world.namespace.as_str();
    let views: BTreeMap<&ObjectRef, (bool, ObjectView<'_>)> = objs
        .iter()
        .map(|(r, o)| (r, (checksum::is_ignored(o.annotations()), o.view())))
        .collect();
    let views_stamp = compute(recipe, stamp_key, namespace, refs, |r| match views.get(r) {
        None => RefState::Absent,
        Some((true, _)) => RefState::Ignored,
        Some((false, v)) => RefState::Present(v),
    });

    let from_view: BTreeMap<&ObjectRef, (bool, ObjectDigest)> = views
        .iter()
        .map(|(r, (ignored, v))| (*r, (*ignored, ObjectDigest::from_view(v))))
        .collect();
    let from_view_stamp = compute(recipe, stamp_key, namespace, refs, |r| {
        match from_view.get(r) {
            None => RefState::Absent,
            Some((true, _)) => RefState::Ignored,
            Some((false, d)) => RefState::Present(d),
        }
    });

    let raw: BTreeMap<ObjectRef, (State, ObjectDigest)> = world
        .objs
        .iter()
        .map(|o| {
            let digests = o
                .entries
                .iter()
                .map(|(k, (t, v))| (k.clone(), *t, Sha256::digest(v).into()));
            (o.oref(), (o.state, ObjectDigest::from_digests(digests)))
        })
        .collect();
    let from_digests_stamp = compute(recipe, stamp_key, namespace, refs, |r| match raw.get(r) {
        None | Some((State::Absent, _)) => RefState::Absent,
        Some((State::Ignored, _)) => RefState::Ignored,
        Some((State::Present, d)) => RefState::Present(d),
    });

    Stamps {
        views: views_stamp,
        from_view: from_view_stamp,
        from_digests: from_digests_stamp,
        reference: reference_stamp(key, world, recipe),
    }
}

/// The stamp of `world` (with default metadata), after checking that every way agrees.
fn stamp(key: Option<&[u8]>, world: &World) -> String {
    stamp_of(key, &world.references(), world, &objects(world, &[]))
}

fn stamp_of(
    key: Option<&[u8]>,
    refs: &References,
    world: &World,
    objs: &BTreeMap<ObjectRef, K8s>,
) -> String {
    stamp_of_with(Recipe::V2, key, refs, world, objs)
}

/// The stamp under `recipe`, after checking that every way agrees.
fn stamp_of_with(
    recipe: Recipe,
    key: Option<&[u8]>,
    refs: &References,
    world: &World,
    objs: &BTreeMap<ObjectRef, K8s>,
) -> String {
    let s = stamps_with(recipe, key, refs, world, objs);
    assert_eq!(
        s.views, s.from_view,
        "{recipe:?}: ObjectView vs ObjectDigest::from_view"
    );
    assert_eq!(
        s.views, s.from_digests,
        "{recipe:?}: ObjectView vs ObjectDigest::from_digests"
    );
    assert_eq!(
        s.views.as_str(),
        s.reference,
        "{recipe:?}: crate vs the recipe as docs/recipe.md words it"
    );
    s.reference
}

/// The v1 stamp of `world` (with default metadata), after checking that every way agrees.
fn stamp_v1(key: Option<&[u8]>, world: &World) -> String {
    stamp_of_with(
        Recipe::V1,
        key,
        &world.references(),
        world,
        &objects(world, &[]),
    )
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// Byte strings that look like the message's own structure.
const PIECES: &[&str] = &[
    "a",
    "b",
    "data",
    "binaryData",
    "absent",
    "present",
    "absent-key",
    "\0",
    "\0\0\0\0\0\0\0\u{4}",
    "\0\0\0\0\0\0\0\u{6}",
    "\0\0\0\0\0\0\0\u{20}",
    "ConfigMap",
    "Secret",
    "confighash-recipe-v1",
];

const KEYS: &[&str] = &[
    "a",
    "b",
    "",
    "data",
    "absent",
    "present\0",
    "a\0\0\0\0\0\0\0\u{4}data",
    "binaryData",
];

const NAMES: &[&str] = &[
    "a",
    "b",
    "ab",
    "data",
    "absent",
    "present",
    "\0",
    "a\0\0\0\0\0\0\0\u{6}absent",
    "Secret",
];

fn tricky() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => vec(select(PIECES), 0..3).prop_map(|p| p.concat()),
        1 => vec(any::<char>(), 0..3).prop_map(String::from_iter),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(KEYS).prop_map(str::to_owned),
        1 => tricky(),
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(NAMES).prop_map(str::to_owned),
        1 => "[a-z0-9.-]{1,6}",
        1 => tricky().prop_filter("names are not empty", |s| !s.is_empty()),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(select(PIECES), 0..3).prop_map(|p| p.concat().into_bytes()),
        vec(any::<u8>(), 0..8),
    ]
}

fn kind() -> impl Strategy<Value = ObjectKind> {
    prop_oneof![Just(CM), Just(SECRET)]
}

fn tag() -> impl Strategy<Value = Tag> {
    prop_oneof![Just(Tag::Data), Just(Tag::BinaryData)]
}

fn state() -> impl Strategy<Value = State> {
    prop_oneof![
        1 => Just(State::Absent),
        4 => Just(State::Present),
        1 => Just(State::Ignored),
    ]
}

fn selection() -> impl Strategy<Value = Selection> {
    prop_oneof![
        Just(Selection::Whole),
        btree_set(key(), 1..4).prop_map(|k| Selection::Keys(k.into())),
    ]
}

fn entries() -> impl Strategy<Value = EntryMap> {
    btree_map(key(), (tag(), value()), 0..4)
}

fn adds() -> impl Strategy<Value = Vec<(Selection, bool)>> {
    vec((selection(), any::<bool>()), 0..3)
}

/// Namespaces: the recipe takes any bytes, though Kubernetes allows only DNS labels.
fn namespace() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(&["default", "shop", "a", "ab", ""][..]).prop_map(str::to_owned),
        1 => tricky(),
    ]
}

fn world() -> impl Strategy<Value = World> {
    (
        namespace(),
        btree_map((kind(), name()), (state(), entries(), adds()), 0..4),
    )
        .prop_map(|(namespace, m)| {
            World::in_namespace(
                &namespace,
                m.into_iter()
                    .map(|((kind, name), (state, entries, adds))| Obj {
                        kind,
                        name,
                        state,
                        entries,
                        adds,
                    }),
            )
        })
}

fn hmac_key() -> impl Strategy<Value = Option<Vec<u8>>> {
    proptest::option::of(vec(any::<u8>(), MIN_KEY_LEN..40))
}

/// A referenced, present object named so that no generated object shares its name.
fn target(kind: ObjectKind, entries: EntryMap, sel: Selection) -> Obj {
    Obj {
        kind,
        name: "zz-target-object".to_owned(),
        state: State::Present,
        entries,
        adds: vec![(sel, false)],
    }
}

fn string_map() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    proptest::option::of(btree_map(
        prop_oneof![
            select(&[
                "app",
                "example.com/x",
                "confighash.dev/checksum",
                "confighash.dev/enabled",
                "kubectl.kubernetes.io/last-applied-configuration",
            ])
            .prop_map(str::to_owned),
            "[a-z]{1,5}",
        ],
        "[a-z0-9 ]{0,6}",
        0..3,
    ))
}

/// Annotations, possibly with `confighash.dev/ignore` set to anything but exactly "true".
fn annotations() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    (
        string_map(),
        proptest::option::of(select(&[
            "false", "TRUE", "True", " true", "true ", "", "yes",
        ])),
    )
        .prop_map(|(mut m, ignore)| {
            if let Some(v) = ignore {
                m.get_or_insert_with(BTreeMap::new)
                    .insert(IGNORE_ANNOTATION.to_owned(), v.to_owned());
            }
            m
        })
}

fn meta() -> impl Strategy<Value = Meta> {
    (
        proptest::option::of("[a-z]{1,8}"),
        string_map(),
        annotations(),
        proptest::option::of("[0-9]{1,6}"),
        proptest::option::of("[0-9a-f-]{8,12}"),
        proptest::option::of(any::<bool>()),
        proptest::option::of(select(&[
            "Opaque",
            "kubernetes.io/tls",
            "kubernetes.io/dockerconfigjson",
        ])),
        any::<bool>(),
    )
        .prop_map(
            |(
                namespace,
                labels,
                annotations,
                resource_version,
                uid,
                immutable,
                type_,
                empty_maps,
            )| {
                Meta {
                    namespace,
                    labels,
                    annotations,
                    resource_version,
                    uid,
                    immutable,
                    type_: type_.map(str::to_owned),
                    empty_maps,
                }
            },
        )
}

/// `world` changed in one small way (or not at all, when the change does not apply).
fn mutate(world: &World, op: u8, i: Index, j: Index, piece: &str) -> World {
    let mut objs = world.objs.clone();
    if op == 10 {
        return World::in_namespace(&format!("{}{piece}", world.namespace), objs);
    }
    if objs.is_empty() {
        objs.push(Obj {
            kind: CM,
            name: format!("a{piece}"),
            state: State::Absent,
            entries: EntryMap::new(),
            adds: vec![(Selection::Whole, false)],
        });
        return World::in_namespace(&world.namespace, objs);
    }
    let n = objs.len();
    let o = &mut objs[i.index(n)];
    let nth_key = |o: &Obj| {
        (!o.entries.is_empty()).then(|| o.entries.keys().nth(j.index(o.entries.len())).cloned())
    };
    match op {
        0 => {
            o.state = match o.state {
                State::Absent => State::Present,
                State::Present => State::Ignored,
                State::Ignored => State::Absent,
            }
        }
        1 => o.name.push_str(piece),
        2 => o.name.insert_str(0, piece),
        3 => {
            if let Some(Some(k)) = nth_key(o) {
                let e = o.entries.get_mut(&k).unwrap();
                e.0 = match e.0 {
                    Tag::Data => Tag::BinaryData,
                    Tag::BinaryData => Tag::Data,
                };
            }
        }
        4 => {
            if let Some(Some(k)) = nth_key(o) {
                let e = o.entries.remove(&k).unwrap();
                o.entries.insert(format!("{k}{piece}"), e);
            }
        }
        5 => {
            if let Some(Some(k)) = nth_key(o) {
                o.entries
                    .get_mut(&k)
                    .unwrap()
                    .1
                    .extend_from_slice(piece.as_bytes());
            }
        }
        6 => o.adds = vec![(Selection::Whole, false)],
        7 => o.adds = vec![(Selection::Keys(o.entries.keys().cloned().collect()), true)],
        8 => {
            let mut keys: BTreeSet<String> = o.entries.keys().cloned().collect();
            keys.insert(piece.to_owned());
            o.adds.push((Selection::Keys(keys.into()), false));
        }
        _ => {
            o.kind = match o.kind {
                ObjectKind::ConfigMap => ObjectKind::Secret,
                ObjectKind::Secret => ObjectKind::ConfigMap,
            }
        }
    }
    World::in_namespace(&world.namespace, objs)
}

fn world_pair() -> impl Strategy<Value = (World, World)> {
    prop_oneof![
        1 => (world(), world()),
        3 => (world(), 0u8..11, any::<Index>(), any::<Index>(), tricky())
            .prop_map(|(w, op, i, j, piece)| {
                let m = mutate(&w, op, i, j, &piece);
                (w, m)
            }),
    ]
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// (a) The order maps are filled in and references are added in never matters.
    #[test]
    fn insertion_order_never_matters(
        (world, shuffled_adds, shuffled_entries) in world().prop_flat_map(|w| {
            let adds = Just(w.adds()).prop_shuffle();
            let entries: Vec<_> = w.objs.iter().map(|o| Just(entry_list(o)).prop_shuffle()).collect();
            (Just(w), adds, entries)
        }),
        key in hmac_key(),
    ) {
        let key = key.as_deref();
        let expected = stamp(key, &world);

        let refs = references(&shuffled_adds);
        prop_assert_eq!(&refs, &world.references());

        let default = Meta::default();
        let objs: BTreeMap<ObjectRef, K8s> = world
            .objs
            .iter()
            .zip(&shuffled_entries)
            .filter_map(|(o, order)| build(o, &default, order).map(|k| (o.oref(), k)))
            .collect();
        let s = stamps(key, &refs, &world, &objs);
        prop_assert_eq!(s.views.as_str(), &expected);
        prop_assert_eq!(s.from_view.as_str(), &expected);

        // Digests given in any order (from_digests) make the same stamp too.
        let digests: BTreeMap<ObjectRef, ObjectDigest> = world
            .objs
            .iter()
            .zip(&shuffled_entries)
            .map(|(o, order)| {
                let d = ObjectDigest::from_digests(
                    order.iter().map(|(k, t, v)| (k.clone(), *t, Sha256::digest(v).into())),
                );
                (o.oref(), d)
            })
            .collect();
        let states: BTreeMap<ObjectRef, State> =
            world.objs.iter().map(|o| (o.oref(), o.state)).collect();
        let stamp_key = key.map(|k| StampKey::new(k.to_vec()).unwrap());
        let from_digests = checksum::compute_stamp(stamp_key.as_ref(), &world.namespace, &refs, |r| {
            match (states.get(r), digests.get(r)) {
                (Some(State::Present), Some(d)) => RefState::Present(d),
                (Some(State::Ignored), _) => RefState::Ignored,
                _ => RefState::Absent,
            }
        });
        prop_assert_eq!(from_digests.as_str(), &expected);
    }

    /// (b) Any single byte changed, inserted or removed in a referenced value changes the stamp:
    /// ConfigMap `data` and `binaryData`, Secret `data`, whole-object and key references.
    #[test]
    fn any_byte_change_in_a_referenced_value_changes_the_stamp(
        background in world(),
        kind in kind(),
        entries in btree_map(key(), (tag(), vec(any::<u8>(), 1..8)), 1..4),
        which in any::<Index>(),
        at in any::<Index>(),
        byte in any::<u8>(),
        op in 0u8..3,
        whole in any::<bool>(),
        extra_keys in btree_set(key(), 0..3),
        key in hmac_key(),
    ) {
        let key = key.as_deref();
        let mut entries = entries;
        // Keep ConfigMap `data` ASCII so every edit below stays UTF-8.
        if kind == CM {
            for (tag, v) in entries.values_mut() {
                if *tag == Tag::Data {
                    v.iter_mut().for_each(|b| *b &= 0x7f);
                }
            }
        }
        let target_key = entries.keys().nth(which.index(entries.len())).unwrap().clone();
        let sel = if whole {
            Selection::Whole
        } else {
            let mut keys = extra_keys;
            keys.insert(target_key.clone());
            Selection::Keys(keys.into())
        };
        let before = background.clone().with(target(kind, entries.clone(), sel.clone()));

        let mut changed = entries;
        let (tag, value) = changed.get_mut(&target_key).unwrap();
        let ascii = kind == CM && *tag == Tag::Data;
        let i = at.index(value.len());
        match op {
            0 => {
                let delta = if ascii { byte % 0x7f + 1 } else { byte.max(1) };
                value[i] ^= delta;
            }
            1 => value.insert(i, if ascii { byte & 0x7f } else { byte }),
            _ => {
                value.remove(i);
            }
        }
        let after = background.with(target(kind, changed, sel));
        prop_assert_ne!(stamp(key, &before), stamp(key, &after));
    }

    /// (c) Under key-level references, keys that are not referenced never matter: their values,
    /// their tags, their presence.
    #[test]
    fn unreferenced_keys_do_not_change_the_stamp(
        background in world(),
        kind in kind(),
        selected in btree_set(key(), 1..4),
        present in vec(any::<bool>(), 4),
        referenced_values in vec((tag(), value()), 4),
        unreferenced_a in entries(),
        unreferenced_b in entries(),
        split in any::<Index>(),
        key in hmac_key(),
    ) {
        let key = key.as_deref();
        let mut a = unreferenced_a;
        let mut b = unreferenced_b;
        a.retain(|k, _| !selected.contains(k));
        b.retain(|k, _| !selected.contains(k));
        for (i, k) in selected.iter().enumerate() {
            if present.get(i).copied().unwrap_or(true) {
                a.insert(k.clone(), referenced_values[i].clone());
                b.insert(k.clone(), referenced_values[i].clone());
            }
        }
        let ta = target(kind, a, Selection::Whole).normalize();
        let tb = target(kind, b, Selection::Whole).normalize();
        prop_assume!(ta.entries != tb.entries);

        // Several key references, which together select `selected`.
        let keys: Vec<String> = selected.iter().cloned().collect();
        let cut = split.index(keys.len());
        let sels = [&keys[..=cut], &keys[cut..]]
            .map(|ks| (Selection::Keys(ks.iter().cloned().collect()), false));
        let with_keys = |t: &Obj| Obj { adds: sels.to_vec(), ..t.clone() };
        prop_assert_eq!(
            stamp(key, &background.clone().with(with_keys(&ta))),
            stamp(key, &background.clone().with(with_keys(&tb)))
        );
        // The same change under a whole-object reference does change the stamp.
        prop_assert_ne!(
            stamp(key, &background.clone().with(ta)),
            stamp(key, &background.with(tb))
        );
    }

    /// (d) Metadata never enters the message: labels, annotations other than ignore (including
    /// ignore with any value but exactly "true"), resourceVersion, uid, the objects' own
    /// `metadata.namespace` (v2 binds the workload's namespace, given apart), immutable, type,
    /// empty maps vs none, and the references' `optional` flags.
    #[test]
    fn metadata_only_changes_do_not_change_the_stamp(
        world in world(),
        metas_a in vec(meta(), 4),
        metas_b in vec(meta(), 4),
        optional_b in vec(any::<bool>(), 0..8),
        key in hmac_key(),
    ) {
        let key = key.as_deref();
        let plain = stamp(key, &world);

        let a = stamp_of(key, &world.references(), &world, &objects(&world, &metas_a));
        let mut adds = world.adds();
        for (i, add) in adds.iter_mut().enumerate() {
            add.3 = optional_b.get(i).copied().unwrap_or(!add.3);
        }
        let b = stamp_of(key, &references(&adds), &world, &objects(&world, &metas_b));
        prop_assert_eq!(&a, &plain);
        prop_assert_eq!(&b, &plain);
    }

    /// (d') The one annotation that counts: `confighash.dev/ignore: "true"` leaves the object out,
    /// exactly as if it were not referenced, which differs from it being there.
    #[test]
    fn ignore_true_is_the_same_as_unreferenced(
        background in world(),
        kind in kind(),
        entries in entries(),
        sel in selection(),
        key in hmac_key(),
    ) {
        let key = key.as_deref();
        let t = target(kind, entries, sel);
        let present = stamp(key, &background.clone().with(t.clone()));
        let ignored = stamp(key, &background.clone().with(Obj { state: State::Ignored, ..t.clone() }));
        let unreferenced = stamp(key, &background.with(Obj { adds: Vec::new(), ..t }));
        prop_assert_eq!(&ignored, &unreferenced);
        prop_assert_ne!(&ignored, &present);
    }

    /// (e) The same key and value bytes in a ConfigMap's `data` and in its `binaryData` are
    /// different content.
    #[test]
    fn data_and_binary_data_with_the_same_bytes_differ(
        background in world(),
        entry_key in key(),
        value in vec(any::<char>(), 0..6).prop_map(String::from_iter),
        others in entries(),
        whole in any::<bool>(),
        key in hmac_key(),
    ) {
        let key = key.as_deref();
        let sel = if whole {
            Selection::Whole
        } else {
            Selection::Keys([entry_key.clone()].into())
        };
        let mut as_data = others;
        as_data.insert(entry_key.clone(), (Tag::Data, value.clone().into_bytes()));
        let mut as_binary = as_data.clone();
        as_binary.insert(entry_key, (Tag::BinaryData, value.into_bytes()));
        prop_assert_ne!(
            stamp(key, &background.clone().with(target(CM, as_data, sel.clone()))),
            stamp(key, &background.with(target(CM, as_binary, sel)))
        );
    }

    /// (f) No namespace, key, name or value, however much it looks like the message's own
    /// framing, makes two different inputs give one message: stamps are equal exactly when the
    /// structured messages are, under v2 and under v1.
    #[test]
    fn stamps_are_equal_exactly_when_the_inputs_are((a, b) in world_pair(), key in hmac_key()) {
        let key = key.as_deref();
        let (ta, tb) = (tokens(&a, Recipe::V2), tokens(&b, Recipe::V2));
        let (sa, sb) = (stamp(key, &a), stamp(key, &b));
        prop_assert_eq!(sa == sb, ta == tb, "tokens a {:?}\ntokens b {:?}", ta, tb);
        let (ta, tb) = (tokens(&a, Recipe::V1), tokens(&b, Recipe::V1));
        let (sa, sb) = (stamp_v1(key, &a), stamp_v1(key, &b));
        prop_assert_eq!(sa == sb, ta == tb, "v1 tokens a {:?}\nv1 tokens b {:?}", ta, tb);
    }

    /// v2 binds the workload's namespace: the same references over the same content in two
    /// namespaces give two stamps (v1 gave one). This is what stops a stamp made for one
    /// namespace from testing a guess of a value in another.
    #[test]
    fn the_same_content_in_two_namespaces_gives_different_stamps(
        world in world(),
        other in namespace(),
        key in hmac_key(),
    ) {
        let key = key.as_deref();
        prop_assume!(other != world.namespace);
        let moved = World { namespace: other, ..world.clone() };
        prop_assert_ne!(stamp(key, &world), stamp(key, &moved));
        prop_assert_eq!(stamp_v1(key, &world), stamp_v1(key, &moved));
    }

    /// v2 names the selected keys of an absent object: two key selections of an absent object,
    /// or a key selection and the whole object, give different stamps (v1 gave one), so a stamp
    /// does not tell whether an object exists by comparison with another selection's.
    #[test]
    fn absent_objects_with_different_key_selections_give_different_stamps(
        background in world(),
        kind in kind(),
        a in proptest::option::of(btree_set(key(), 1..4)),
        b in proptest::option::of(btree_set(key(), 1..4)),
        key in hmac_key(),
    ) {
        let key = key.as_deref();
        prop_assume!(a != b);
        let absent = |keys: &Option<BTreeSet<String>>| Obj {
            state: State::Absent,
            adds: vec![(keys.clone().map_or(Selection::Whole, |k| Selection::Keys(k.into())), false)],
            ..target(kind, EntryMap::new(), Selection::Whole)
        };
        let (wa, wb) = (background.clone().with(absent(&a)), background.with(absent(&b)));
        prop_assert_ne!(stamp(key, &wa), stamp(key, &wb));
        prop_assert_eq!(stamp_v1(key, &wa), stamp_v1(key, &wb));
    }

    /// (g) Whole objects and digests (from the views, or computed independently with sha2) give
    /// the same stamp, with and without a key, and the stamp has the documented form.
    #[test]
    fn whole_object_and_digest_only_stamps_agree(world in world(), key in hmac_key()) {
        let k = key.as_deref();
        let s = stamps(k, &world.references(), &world, &objects(&world, &[]));
        prop_assert_eq!(&s.views, &s.from_view);
        prop_assert_eq!(&s.views, &s.from_digests);

        let key_id = match k {
            None => "plain".to_owned(),
            Some(k) => hex::encode(&Sha256::digest(k)[..4]),
        };
        let stamp_key = k.map(|k| StampKey::new(k.to_vec()).unwrap());
        prop_assert_eq!(checksum::key_id(stamp_key.as_ref()), key_id.as_str());
        let v1 = stamps_with(Recipe::V1, k, &world.references(), &world, &objects(&world, &[]));
        prop_assert_eq!(&v1.views, &v1.from_view);
        prop_assert_eq!(&v1.views, &v1.from_digests);
        for (version, text) in [("v2", s.views.to_string()), ("v1", v1.views.to_string())] {
            let digest = text
                .strip_prefix(&format!("{version}:{key_id}:"))
                .expect("<version>:<keyid>:");
            prop_assert_eq!(digest.len(), 64);
            prop_assert!(digest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            prop_assert!(checksum::is_current(&text, &key_id));
            prop_assert!(!checksum::is_current(&text, "0badc0de"));
        }
        prop_assert_eq!(Recipe::of_stamp(s.views.as_str(), &key_id), Some(Recipe::V2));
        prop_assert_eq!(Recipe::of_stamp(v1.views.as_str(), &key_id), Some(Recipe::V1));
    }

    /// (h) The crate computes exactly the recipes docs/recipe.md describes (an implementation
    /// written from the text), and a key changes every stamp.
    #[test]
    fn stamps_match_the_recipe_as_designed(world in world(), key in vec(any::<u8>(), MIN_KEY_LEN..40)) {
        for recipe in [Recipe::V2, Recipe::V1] {
            let refs = world.references();
            let s = stamps_with(recipe, None, &refs, &world, &objects(&world, &[]));
            prop_assert_eq!(s.views.as_str(), s.reference.as_str());
            let keyed = stamps_with(recipe, Some(key.as_slice()), &refs, &world, &objects(&world, &[]));
            prop_assert_eq!(keyed.views.as_str(), keyed.reference.as_str());
            prop_assert_ne!(s.reference.rsplit(':').next(), keyed.reference.rsplit(':').next());
        }
    }

    /// Offline, a Secret's `stringData` counts as `data`, and wins over `data` for one key.
    #[test]
    fn secret_string_data_counts_as_data(
        entries in btree_map(key(), vec(any::<char>(), 0..6).prop_map(String::from_iter), 0..5),
        in_string_data in vec(any::<bool>(), 5),
        shadowed in btree_map(key(), vec(any::<u8>(), 0..4), 0..3),
        sel in selection(),
        key in hmac_key(),
    ) {
        let key = key.as_deref();
        let model: EntryMap = entries
            .iter()
            .map(|(k, v)| (k.clone(), (Tag::Data, v.clone().into_bytes())))
            .collect();
        let world = World::new([target(SECRET, model, sel)]);
        let expected = stamp(key, &world);

        let mut data = BTreeMap::new();
        let mut string_data = BTreeMap::new();
        for (i, (k, v)) in entries.iter().enumerate() {
            if in_string_data.get(i).copied().unwrap_or(false) {
                string_data.insert(k.clone(), v.clone());
                // A different value under `data` for the same key is overridden.
                if let Some(old) = shadowed.get(k) {
                    data.insert(k.clone(), ByteString(old.clone()));
                }
            } else {
                data.insert(k.clone(), ByteString(v.clone().into_bytes()));
            }
        }
        let secret = Secret {
            data: Some(data),
            string_data: Some(string_data),
            ..Default::default()
        };
        let objs = BTreeMap::from([(world.objs[0].oref(), K8s::Secret(secret))]);
        let s = stamps(key, &world.references(), &world, &objs);
        prop_assert_eq!(s.views.as_str(), &expected);
        prop_assert_eq!(s.from_view.as_str(), &expected);
    }

    /// Keys shorter than 16 bytes are refused; 16 and more are taken as they are.
    #[test]
    fn short_keys_are_refused(bytes in vec(any::<u8>(), 0..40)) {
        let result = StampKey::new(bytes.clone());
        if bytes.len() < MIN_KEY_LEN {
            prop_assert!(result.is_err());
        } else {
            let k = result.unwrap();
            prop_assert_eq!(k.id(), &hex::encode(Sha256::digest(&bytes))[..8]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Crafted collisions: inputs that a framing without length prefixes would confuse
// ---------------------------------------------------------------------------------------------

fn be64(n: usize) -> String {
    (n as u64)
        .to_be_bytes()
        .iter()
        .map(|&b| char::from(b))
        .collect()
}

fn lp_str(s: &str) -> String {
    format!("{}{s}", be64(s.len()))
}

fn obj(kind: ObjectKind, name: &str, state: State, entries: &[(&str, Tag, &[u8])]) -> Obj {
    Obj {
        kind,
        name: name.to_owned(),
        state,
        entries: entries
            .iter()
            .map(|(k, t, v)| (k.to_string(), (*t, v.to_vec())))
            .collect(),
        adds: vec![(Selection::Whole, false)],
    }
}

fn keys_ref(o: Obj, keys: &[&str]) -> Obj {
    Obj {
        adds: vec![(
            Selection::Keys(keys.iter().map(|k| k.to_string()).collect()),
            false,
        )],
        ..o
    }
}

#[test]
fn separator_like_names_keys_and_values_do_not_collide() {
    use State::{Absent, Present};
    use Tag::{BinaryData as Bin, Data};
    let cases: Vec<(&str, World)> = vec![
        (
            "two absent objects",
            World::new([obj(CM, "a", Absent, &[]), obj(CM, "b", Absent, &[])]),
        ),
        (
            "one absent object whose name holds the framing of two",
            World::new([obj(
                CM,
                &format!("a{}{}b", lp_str("absent"), lp_str("ConfigMap")),
                Absent,
                &[],
            )]),
        ),
        ("absent", World::new([obj(CM, "a", Absent, &[])])),
        (
            "present and empty",
            World::new([obj(CM, "a", Present, &[])]),
        ),
        (
            "name ending in absent",
            World::new([obj(CM, &format!("a{}", lp_str("absent")), Present, &[])]),
        ),
        (
            "key absent-key",
            World::new([obj(CM, "a", Present, &[("absent-key", Data, b"")])]),
        ),
        (
            "a missing selected key",
            World::new([keys_ref(obj(CM, "a", Present, &[]), &["absent-key"])]),
        ),
        (
            "a missing selected key named like a tag",
            World::new([keys_ref(obj(CM, "a", Present, &[]), &["data"])]),
        ),
        (
            "key data with empty value",
            World::new([obj(CM, "a", Present, &[("data", Data, b"")])]),
        ),
        (
            "key data in binaryData",
            World::new([obj(CM, "a", Present, &[("data", Bin, b"")])]),
        ),
        (
            "key and value split one way",
            World::new([obj(CM, "a", Present, &[("k\0", Data, b"\0v")])]),
        ),
        (
            "key and value split another way",
            World::new([obj(CM, "a", Present, &[("k", Data, b"\0\0v")])]),
        ),
        (
            "NUL key, NUL value",
            World::new([obj(SECRET, "a", Present, &[("\0", Data, b"\0")])]),
        ),
        (
            "empty key, two NUL value",
            World::new([obj(SECRET, "a", Present, &[("", Data, b"\0\0")])]),
        ),
        (
            "name holding a key's framing",
            World::new([obj(
                SECRET,
                &format!("a{}{}", lp_str("present"), lp_str("data")),
                Present,
                &[],
            )]),
        ),
        (
            "the same key as an entry",
            World::new([obj(SECRET, "a", Present, &[("", Data, b"")])]),
        ),
        (
            "missing selected keys spelling the next object's framing",
            World::new([keys_ref(
                obj(CM, "a", Present, &[]),
                &["ConfigMap", "ab", "absent"],
            )]),
        ),
        (
            "an empty object followed by an absent one",
            World::new([obj(CM, "a", Present, &[]), obj(CM, "ab", Absent, &[])]),
        ),
        (
            "an absent object selecting key a",
            World::new([keys_ref(obj(CM, "a", Absent, &[]), &["a"])]),
        ),
        (
            "an absent object selecting keys a and b",
            World::new([keys_ref(obj(CM, "a", Absent, &[]), &["a", "b"])]),
        ),
        (
            "an absent object selecting one key holding the framing of two",
            World::new([keys_ref(
                obj(CM, "a", Absent, &[]),
                &[&format!("a{}", lp_str("b"))],
            )]),
        ),
        (
            "an absent object selecting keys spelling the next object's framing",
            World::new([keys_ref(
                obj(CM, "a", Absent, &[]),
                &["ConfigMap", "ab", "absent"],
            )]),
        ),
        (
            "an absent object selecting key absent-key",
            World::new([keys_ref(obj(CM, "a", Absent, &[]), &["absent-key"])]),
        ),
        (
            "ConfigMap and Secret of one name",
            World::new([obj(CM, "x", Absent, &[]), obj(SECRET, "x", Absent, &[])]),
        ),
        (
            "ConfigMap name holding the Secret's framing",
            World::new([obj(
                CM,
                &format!("x{}{}x", lp_str("absent"), lp_str("Secret")),
                Absent,
                &[],
            )]),
        ),
    ];
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for (what, world) in &cases {
        let s = stamp(None, world);
        if let Some(other) = seen.insert(s.clone(), what) {
            panic!("{what:?} and {other:?} give the same stamp {s}");
        }
    }
    assert_eq!(seen.len(), cases.len());
}

/// Digests are opaque 32 bytes; with digests that happen to be ASCII, a key could carry another
/// entry's whole framing. Length prefixes keep the two entry sets apart.
#[test]
fn a_key_holding_another_entrys_framing_does_not_collide() {
    let d1: [u8; 32] = *b"0123456789abcdef0123456789abcdef";
    let d2: [u8; 32] = *b"fedcba9876543210fedcba9876543210";
    let d1_str = std::str::from_utf8(&d1).unwrap();
    // Without a length prefix on keys, {k: d1, m: d2} would frame as this one entry.
    let forged = format!("k{}{d1_str}{}m", be64(32), lp_str("data"));
    let two = ObjectDigest::from_digests([
        ("k".to_owned(), Tag::Data, d1),
        ("m".to_owned(), Tag::Data, d2),
    ]);
    let one = ObjectDigest::from_digests([(forged.clone(), Tag::Data, d2)]);
    let mut refs = References::default();
    refs.add(CM, "cfg", Selection::Whole, false);
    let a = checksum::compute_stamp(None, "default", &refs, |_| RefState::Present(&two));
    let b = checksum::compute_stamp(None, "default", &refs, |_| RefState::Present(&one));
    assert_ne!(a, b);

    // The same, selecting keys.
    let mut refs = References::default();
    refs.add(
        CM,
        "cfg",
        Selection::Keys(["k".to_owned(), "m".to_owned(), forged].into()),
        false,
    );
    let a = checksum::compute_stamp(None, "default", &refs, |_| RefState::Present(&two));
    let b = checksum::compute_stamp(None, "default", &refs, |_| RefState::Present(&one));
    assert_ne!(a, b);
}

#[test]
fn from_digests_keeps_the_last_of_a_repeated_key() {
    let d1 = [1u8; 32];
    let d2 = [2u8; 32];
    let repeated = ObjectDigest::from_digests([
        ("k".to_owned(), Tag::Data, d1),
        ("k".to_owned(), Tag::BinaryData, d2),
    ]);
    let last = ObjectDigest::from_digests([("k".to_owned(), Tag::BinaryData, d2)]);
    assert_eq!(repeated, last);
    assert_eq!(repeated.len(), 1);
}

/// A namespace holding the framing of what follows it gives another message: the namespace is
/// length-prefixed like everything else.
#[test]
fn a_namespace_holding_the_next_objects_framing_does_not_collide() {
    let absent = |name: &str| obj(CM, name, State::Absent, &[]);
    let cases = [
        World::in_namespace("a", [absent("b")]),
        World::in_namespace(&format!("a{}{}", lp_str("ConfigMap"), lp_str("b")), []),
        World::in_namespace("", [absent("b")]),
        World::in_namespace("a", []),
        World::in_namespace("", []),
    ];
    let mut seen = BTreeSet::new();
    for world in &cases {
        assert!(seen.insert(stamp(None, world)), "{world:?} collides");
    }
}
