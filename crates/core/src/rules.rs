//! When a stamp changes: the one rule shared by the webhook, the watcher and reconcile.
//!
//! The *expected stamp* is the recipe over the current state of a workload's references. The
//! stamp on a workload becomes the expected stamp, except:
//! 1. the lookup failed: nothing changes (UPDATE keeps the old object's stamp; CREATE gets the
//!    `confighash.dev/unstamped` marker instead of a stamp). So does a workload whose references
//!    hold more decoded bytes than `--max-reference-bytes` ([`Lookup::TooLarge`]; its marker
//!    says `too-large`, and reconcile retries it: Secrets shrink without any workload write);
//! 2. a required reference is absent: an existing stamp is kept (unless `--roll-on-delete`);
//! 3. the stamp is foreign (another key, an unknown recipe, malformed), or missing on a workload
//!    that predates confighash: kept by reconcile and by every UPDATE that neither carries a new
//!    stamp nor restarts the rollout; replaced at the next config change the watcher acts on (its
//!    touch carries a current stamp), or by a `kubectl rollout restart`;
//! 4. opted-out workloads are never stamped; an UPDATE that opts one out and drops its stamp
//!    gets the old stamp back, so opting out rolls nothing.
//!
//! Why a template change does not replace a foreign stamp (or stamp a workload that predates
//! confighash): the webhook cannot tell a template change from a field that another mutating
//! webhook adds after it. A `kubectl replace` of the git manifest (no stamp, and without the
//! field the other webhook adds at every UPDATE) looks like a template change when confighash
//! runs first; stamping it then would roll pods once the other webhook has put its field back
//! and the template is otherwise the same as before. Reinvocation does not help: the second call
//! carries the stamp confighash just wrote, which is exactly what the watcher's touch carries.
//! So only the request's own stamp says "stamp me" (the watcher's touch, or anyone who writes the
//! annotation on purpose), and so does a change of `kubectl.kubernetes.io/restartedAt`: a
//! rollout restart rolls the pods anyway, and no webhook adds that annotation.
//!
//! A stamp of the older recipe v1 made with the current key is not foreign: it is compared with
//! the expected stamp under v1 (`expected_v1` of [`Lookup::Resolved`]), kept while equal and replaced
//! by the v2 stamp when stale, so upgrading rolls nothing and a config change made during the
//! upgrade still rolls once. A rollout restart writes v2.

use crate::checksum::{self, Recipe, RefState, Stamp, StampKey, is_current};
use crate::refs::{ObjectRef, References};

/// What the stamp on a workload currently is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Current<'a> {
    /// The pod template's `confighash.dev/checksum`.
    pub stamp: Option<&'a str>,
    /// Whether the workload carries the `confighash.dev/unstamped` marker.
    pub marker: bool,
}

/// Why the stamp is being decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger<'a> {
    /// Admission of a CREATE.
    Create,
    /// Admission of an UPDATE (or PATCH): `old` is what `oldObject` carried; `restart` says
    /// whether the request changes the pod template's `kubectl.kubernetes.io/restartedAt` (a
    /// `kubectl rollout restart`, which rolls the pods anyway).
    Update { old: Current<'a>, restart: bool },
    /// The watcher saw the content of a referenced object change.
    ConfigChange,
    /// The periodic (and at start) comparison of stamps with expected stamps.
    Reconcile,
}

/// The state of a workload's references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Reading a reference failed (any error but NotFound, or the deadline passed).
    Failed,
    /// The references hold more decoded bytes than the limit (`--max-reference-bytes`): at
    /// least `bytes` (the webhook stops reading once past the limit).
    TooLarge { bytes: u64 },
    /// Every reference was read (NotFound counts as read: absent).
    Resolved {
        /// The expected stamp: recipe v2, the only one ever written.
        expected: Stamp,
        /// The expected stamp under recipe v1, computed over the same state. Supply it exactly
        /// when [`needs_v1`] says so (it costs a second hash); otherwise `None`. A v1 stamp that
        /// needs it but comes without it cannot be checked and is treated as foreign (rule 3).
        expected_v1: Option<Stamp>,
        /// Some reference that is not optional does not exist.
        required_absent: bool,
    },
}

/// What the recipe sees of the objects a workload references, in the workload's namespace: the
/// webhook's lookups, the watcher's index and offline stamping each implement it.
pub trait View {
    fn state(&self, object: &ObjectRef) -> RefState<'_>;
}

/// The rules' view of a workload's references in `namespace`: the expected stamp (signed with
/// `key`, plain without), the expected v1 stamp over the same state when `with_v1` (see
/// [`needs_v1`]), and whether a required reference is absent; or [`Lookup::TooLarge`] when
/// the references hold more than `max_bytes` ([`reference_bytes`]).
pub fn expected(
    view: &impl View,
    key: Option<&StampKey>,
    namespace: &str,
    refs: &References,
    with_v1: bool,
    max_bytes: u64,
) -> Lookup {
    let bytes = reference_bytes(view, refs);
    if bytes > max_bytes {
        return Lookup::TooLarge { bytes };
    }
    Lookup::Resolved {
        expected: expected_stamp(view, key, namespace, refs),
        expected_v1: with_v1.then(|| checksum::compute_stamp_v1(key, refs, |r| view.state(r))),
        required_absent: refs
            .iter()
            .any(|(r, spec)| !spec.optional && matches!(view.state(r), RefState::Absent)),
    }
}

/// The decoded bytes the recipe reads for a workload: the values of every referenced object that
/// exists and is not ignored, each object once. `--max-reference-bytes` bounds it.
pub fn reference_bytes(view: &impl View, refs: &References) -> u64 {
    refs.iter()
        .map(|(r, _)| match view.state(r) {
            RefState::Present(digest) => digest.bytes(),
            RefState::Absent | RefState::Ignored => 0,
        })
        .fold(0, u64::saturating_add)
}

/// The stamp (recipe v2) a workload in `namespace` with references `refs` should carry.
pub fn expected_stamp(
    view: &impl View,
    key: Option<&StampKey>,
    namespace: &str,
    refs: &References,
) -> Stamp {
    checksum::compute_stamp(key, namespace, refs, |r| view.state(r))
}

/// The flags that change the rules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// `--roll-on-delete`: a deleted required reference changes the stamp too.
    pub roll_on_delete: bool,
    /// `--stamp-existing`: reconcile stamps workloads that have never been stamped.
    pub stamp_existing: bool,
}

/// Which rule decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The stamp becomes the expected stamp, which differs from the current one. (The expected
    /// stamp is the v2 stamp, or a v1 stamp with the current key that is still right under v1.)
    Stamped,
    /// The stamp already is the expected stamp.
    Unchanged,
    /// Rule 1: the lookup failed.
    KeptOnError,
    /// Rule 1: the references hold more than `--max-reference-bytes`.
    KeptTooLarge,
    /// Rule 2: a required reference is absent.
    KeptAbsent,
    /// Rule 3: a foreign stamp is kept.
    KeptForeign,
    /// Rule 3: a workload never stamped is left unstamped until its config changes.
    KeptUnstamped,
    /// Rule 4: opted out.
    Skipped,
}

impl Outcome {
    pub const ALL: [Outcome; 8] = [
        Outcome::Stamped,
        Outcome::Unchanged,
        Outcome::KeptOnError,
        Outcome::KeptTooLarge,
        Outcome::KeptAbsent,
        Outcome::KeptForeign,
        Outcome::KeptUnstamped,
        Outcome::Skipped,
    ];

    /// The name used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Stamped => "stamped",
            Outcome::Unchanged => "unchanged",
            Outcome::KeptOnError => "kept-on-error",
            Outcome::KeptTooLarge => "too-large",
            Outcome::KeptAbsent => "kept-absent",
            Outcome::KeptForeign => "kept-foreign",
            Outcome::KeptUnstamped => "kept-unstamped",
            Outcome::Skipped => "skipped",
        }
    }
}

/// What the workload should carry after the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub stamp: Option<String>,
    pub marker: bool,
    pub outcome: Outcome,
}

impl Decision {
    /// Whether the workload must be changed to carry this decision.
    pub fn changes(&self, current: Current<'_>) -> bool {
        self.stamp.as_deref() != current.stamp || self.marker != current.marker
    }

    fn keep(stamp: Option<&str>, marker: bool, outcome: Outcome) -> Self {
        Decision {
            stamp: stamp.map(str::to_owned),
            marker,
            outcome,
        }
    }
}

/// The stamp the workload had before this request: the one rules 1 to 3 keep.
fn existing<'a>(trigger: Trigger<'a>, current: Current<'a>) -> Current<'a> {
    match trigger {
        Trigger::Create => Current::default(),
        Trigger::Update { old, .. } => old,
        Trigger::ConfigChange | Trigger::Reconcile => current,
    }
}

/// The v1 stamp [`decide`] checks under recipe v1: the existing stamp, when it is a v1 stamp made
/// with the current key, carries no marker (a marker is always resolved with a v2 stamp), and the
/// request is not a rollout restart (which rolls anyway, so it writes v2).
fn v1_stamp<'a>(trigger: Trigger<'a>, current: Current<'a>, key_id: &str) -> Option<&'a str> {
    if let Trigger::Update { restart: true, .. } = trigger {
        return None;
    }
    let existing = existing(trigger, current);
    if existing.marker {
        return None;
    }
    existing
        .stamp
        .filter(|s| Recipe::of_stamp(s, key_id) == Some(Recipe::V1))
}

/// Whether [`decide`] needs the expected v1 stamp (`expected_v1` of [`Lookup::Resolved`]) for this
/// workload: only when the stamp it keeps or replaces is a v1 stamp made with the current key.
pub fn needs_v1(trigger: Trigger<'_>, current: Current<'_>, key_id: &str) -> bool {
    v1_stamp(trigger, current, key_id).is_some()
}

/// Decides the stamp (and marker) a workload should carry.
///
/// `current` is the workload as submitted (webhook) or as stored (watcher); `key_id` is the id of
/// the key the expected stamps were made with.
pub fn decide(
    trigger: Trigger<'_>,
    current: Current<'_>,
    opted_out: bool,
    lookup: &Lookup,
    key_id: &str,
    options: Options,
) -> Decision {
    // Rule 4. An UPDATE that drops the stamp as it opts out (a `kubectl replace` of a manifest
    // that gained the label) gets the old one back: opting out rolls nothing.
    if opted_out {
        return match trigger {
            Trigger::Update { old, .. } if current.stamp.is_none() && !current.marker => {
                Decision::keep(old.stamp, old.marker, Outcome::Skipped)
            }
            _ => Decision::keep(current.stamp, current.marker, Outcome::Skipped),
        };
    }
    let existing = existing(trigger, current);

    // Rule 1.
    let (expected, expected_v1, required_absent) = match lookup {
        Lookup::Failed | Lookup::TooLarge { .. } => {
            let outcome = match lookup {
                Lookup::TooLarge { .. } => Outcome::KeptTooLarge,
                _ => Outcome::KeptOnError,
            };
            return match trigger {
                Trigger::Create => Decision::keep(current.stamp, true, outcome),
                _ => Decision::keep(existing.stamp, existing.marker, outcome),
            };
        }
        Lookup::Resolved {
            expected,
            expected_v1,
            required_absent,
        } => (expected, expected_v1.as_ref(), *required_absent),
    };

    // A v1 stamp with the current key is ours when it can be checked under v1.
    let v1 = v1_stamp(trigger, current, key_id);
    let checkable = v1.is_none() || expected_v1.is_some();

    // Rule 3. A marker means "stamp me": it is never kept.
    let existing_is_current = existing.stamp.is_some_and(|s| is_current(s, key_id)) && checkable;
    if !existing_is_current && !existing.marker {
        let passive = match trigger {
            // Only a request that carries a new stamp, or restarts the rollout, asks for one (see
            // the module comment).
            Trigger::Update { restart, .. } => {
                !restart && (current.stamp.is_none() || current.stamp == existing.stamp)
            }
            Trigger::Reconcile => existing.stamp.is_some() || !options.stamp_existing,
            Trigger::Create | Trigger::ConfigChange => false,
        };
        if passive {
            let outcome = match existing.stamp {
                Some(_) => Outcome::KeptForeign,
                None => Outcome::KeptUnstamped,
            };
            return Decision::keep(existing.stamp, false, outcome);
        }
    }

    // Rule 2.
    if required_absent
        && !options.roll_on_delete
        && !existing.marker
        && let Some(stamp) = existing.stamp
    {
        return Decision::keep(Some(stamp), false, Outcome::KeptAbsent);
    }

    // A v1 stamp that is right under v1 stays; a stale one becomes the v2 stamp below.
    let expected = match (v1, expected_v1) {
        (Some(stamp), Some(expected_v1)) if stamp == expected_v1.as_str() => stamp,
        _ => expected.as_str(),
    };
    let outcome = if current.stamp == Some(expected) && !current.marker {
        Outcome::Unchanged
    } else {
        Outcome::Stamped
    };
    Decision::keep(Some(expected), false, outcome)
}
