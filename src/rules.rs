//! When a stamp changes: the one rule shared by the webhook, the watcher and reconcile.
//!
//! The *expected stamp* is the recipe over the current state of a workload's references. The
//! stamp on a workload becomes the expected stamp, except:
//! 1. the lookup failed: nothing changes (UPDATE keeps the old object's stamp; CREATE gets the
//!    `confighash.dev/unstamped` marker instead of a stamp);
//! 2. a required reference is absent: an existing stamp is kept (unless `--roll-on-delete`);
//! 3. the stamp is foreign (other recipe version or key), or missing on a workload that predates
//!    confighash: kept on an UPDATE that leaves the template otherwise unchanged and by reconcile,
//!    replaced at the next real change;
//! 4. opted-out workloads are never stamped.

use crate::checksum::{Stamp, is_current};

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
    /// Admission of an UPDATE (or PATCH): `old` is what `oldObject` carried, and
    /// `template_unchanged` says whether the pod templates are equal apart from the stamp.
    Update {
        old: Current<'a>,
        template_unchanged: bool,
    },
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
    /// Every reference was read (NotFound counts as read: absent).
    Resolved {
        expected: Stamp,
        /// Some reference that is not optional does not exist.
        required_absent: bool,
    },
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
    /// The stamp becomes the expected stamp, which differs from the current one.
    Stamped,
    /// The stamp already is the expected stamp.
    Unchanged,
    /// Rule 1: the lookup failed.
    KeptOnError,
    /// Rule 2: a required reference is absent.
    KeptAbsent,
    /// Rule 3: a foreign stamp is kept.
    KeptForeign,
    /// Rule 3: a workload never stamped is left unstamped until its next real change.
    KeptUnstamped,
    /// Rule 4: opted out.
    Skipped,
}

impl Outcome {
    /// The name used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Stamped => "stamped",
            Outcome::Unchanged => "unchanged",
            Outcome::KeptOnError => "kept-on-error",
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

/// Decides the stamp (and marker) a workload should carry.
///
/// `current` is the workload as submitted (webhook) or as stored (watcher); `key_id` is the id of
/// the key the expected stamp was made with.
pub fn decide(
    trigger: Trigger<'_>,
    current: Current<'_>,
    opted_out: bool,
    lookup: &Lookup,
    key_id: &str,
    options: Options,
) -> Decision {
    // Rule 4.
    if opted_out {
        return Decision::keep(current.stamp, current.marker, Outcome::Skipped);
    }
    // The stamp the workload had before this request: the one rules 1 to 3 keep.
    let existing = match trigger {
        Trigger::Create => Current::default(),
        Trigger::Update { old, .. } => old,
        Trigger::ConfigChange | Trigger::Reconcile => current,
    };

    // Rule 1.
    let (expected, required_absent) = match lookup {
        Lookup::Failed => {
            return match trigger {
                Trigger::Create => Decision::keep(current.stamp, true, Outcome::KeptOnError),
                _ => Decision::keep(existing.stamp, existing.marker, Outcome::KeptOnError),
            };
        }
        Lookup::Resolved {
            expected,
            required_absent,
        } => (expected, *required_absent),
    };

    // Rule 3. A marker means "stamp me": it is never kept.
    let existing_is_current = existing.stamp.is_some_and(|s| is_current(s, key_id));
    if !existing_is_current && !existing.marker {
        let passive = match trigger {
            Trigger::Update {
                template_unchanged, ..
            } => template_unchanged && (current.stamp.is_none() || current.stamp == existing.stamp),
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

    let outcome = if current.stamp == Some(expected.as_str()) && !current.marker {
        Outcome::Unchanged
    } else {
        Outcome::Stamped
    };
    Decision::keep(Some(expected.as_str()), false, outcome)
}
