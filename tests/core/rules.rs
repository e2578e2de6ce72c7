//! The stamp rules of the README's "When a stamp changes", one table row per case, and the upgrade
//! from recipe v1 as properties over sequences of events.

use crate::build;

use build::key;
use confighash::core::checksum::{self, Recipe, Stamp, StampKey};
use confighash::core::refs::{ObjectKind, References, Selection};
use confighash::core::rules::{
    Current, Decision, Lookup, Options, Outcome, Trigger, decide, needs_v1,
};
use proptest::prelude::*;

/// The workloads' namespace.
const NS: &str = "shop";

/// The expected stamp of a workload without references, made with the current key.
fn expected_stamp() -> Stamp {
    checksum::compute_stamp(Some(&key()), NS, &References::default(), |_| {
        checksum::RefState::Absent
    })
}

/// The same under recipe v1: what an earlier release stamped.
fn expected_v1_stamp() -> Stamp {
    checksum::compute_stamp_v1(Some(&key()), &References::default(), |_| {
        checksum::RefState::Absent
    })
}

fn expected() -> String {
    expected_stamp().to_string()
}

/// A stamp made with the current key over other content (stale digest).
const STALE: &str = "v2:3eb1bd43:0000000000000000000000000000000000000000000000000000000000000000";
/// A recipe v1 stamp made with the current key over other content.
const STALE_V1: &str =
    "v1:3eb1bd43:0000000000000000000000000000000000000000000000000000000000000000";
/// A stamp made with another key.
const FOREIGN_KEY: &str =
    "v2:deadbeef:1111111111111111111111111111111111111111111111111111111111111111";
/// A recipe v1 stamp made with another key.
const FOREIGN_KEY_V1: &str =
    "v1:deadbeef:1111111111111111111111111111111111111111111111111111111111111111";
/// A stamp made by a recipe this build does not know.
const FOREIGN_RECIPE: &str =
    "v3:3eb1bd43:2222222222222222222222222222222222222222222222222222222222222222";

const OK: u8 = 0;
const ABSENT: u8 = 1;
const FAILED: u8 = 2;

/// The lookup a caller makes: the expected v1 stamp only when `with_v1`.
fn lookup(state: u8, with_v1: bool) -> Lookup {
    match state {
        FAILED => Lookup::Failed,
        s => Lookup::Resolved {
            expected: expected_stamp(),
            expected_v1: with_v1.then(expected_v1_stamp),
            required_absent: s == ABSENT,
        },
    }
}

fn cur(stamp: Option<&str>, marker: bool) -> Current<'_> {
    Current { stamp, marker }
}

fn update(old: Current<'_>) -> Trigger<'_> {
    Trigger::Update {
        old,
        restart: false,
    }
}

/// An UPDATE that changes `kubectl.kubernetes.io/restartedAt` (`kubectl rollout restart`).
fn restart(old: Current<'_>) -> Trigger<'_> {
    Trigger::Update { old, restart: true }
}

struct Case<'a> {
    name: &'a str,
    trigger: Trigger<'a>,
    current: Current<'a>,
    lookup: u8,
    opted_out: bool,
    options: Options,
    /// The stamp the workload must carry afterwards ("EXPECTED" for the expected stamp,
    /// "EXPECTED_V1" for the expected v1 stamp).
    stamp: Option<&'a str>,
    marker: bool,
    outcome: Outcome,
}

const EXPECTED: &str = "EXPECTED";
const EXPECTED_V1: &str = "EXPECTED_V1";
const NONE: Options = Options {
    roll_on_delete: false,
    stamp_existing: false,
};
const ROLL_ON_DELETE: Options = Options {
    roll_on_delete: true,
    stamp_existing: false,
};
const STAMP_EXISTING: Options = Options {
    roll_on_delete: false,
    stamp_existing: true,
};

fn case<'a>(name: &'a str, trigger: Trigger<'a>, current: Current<'a>, lookup: u8) -> Case<'a> {
    Case {
        name,
        trigger,
        current,
        lookup,
        opted_out: false,
        options: NONE,
        stamp: Some(EXPECTED),
        marker: false,
        outcome: Outcome::Stamped,
    }
}

impl<'a> Case<'a> {
    fn then(mut self, stamp: Option<&'a str>, marker: bool, outcome: Outcome) -> Self {
        self.stamp = stamp;
        self.marker = marker;
        self.outcome = outcome;
        self
    }
    fn options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }
    fn opted_out(mut self) -> Self {
        self.opted_out = true;
        self
    }
}

#[test]
fn every_rule() {
    let exp = expected();
    let e = Some(exp.as_str());
    let exp_v1 = expected_v1_stamp().to_string();
    let e1 = Some(exp_v1.as_str());
    let none = cur(None, false);
    let cases = [
        // The normal rule: the stamp becomes the expected stamp.
        case("create stamps", Trigger::Create, none, OK),
        case("create already right", Trigger::Create, cur(e, false), OK).then(
            Some(EXPECTED),
            false,
            Outcome::Unchanged,
        ),
        case(
            "create replaces a copied stamp",
            Trigger::Create,
            cur(Some(STALE), false),
            OK,
        ),
        case(
            "update restores a dropped stamp",
            update(cur(e, false)),
            none,
            OK,
        ),
        case(
            "update corrects a stale digest",
            update(cur(Some(STALE), false)),
            cur(Some(STALE), false),
            OK,
        ),
        case(
            "update already right gives no change",
            update(cur(e, false)),
            cur(e, false),
            OK,
        )
        .then(Some(EXPECTED), false, Outcome::Unchanged),
        case(
            "config change touches a stale stamp",
            Trigger::ConfigChange,
            cur(Some(STALE), false),
            OK,
        ),
        case(
            "reconcile touches a stale stamp",
            Trigger::Reconcile,
            cur(Some(STALE), false),
            OK,
        ),
        case(
            "reconcile leaves a right stamp",
            Trigger::Reconcile,
            cur(e, false),
            OK,
        )
        .then(Some(EXPECTED), false, Outcome::Unchanged),
        // Rule 1: lookup failed.
        case("create lookup failed marks", Trigger::Create, none, FAILED).then(
            None,
            true,
            Outcome::KeptOnError,
        ),
        case(
            "create lookup failed leaves a carried stamp",
            Trigger::Create,
            cur(Some(STALE), false),
            FAILED,
        )
        .then(Some(STALE), true, Outcome::KeptOnError),
        case(
            "update lookup failed keeps the old stamp",
            update(cur(Some(STALE), false)),
            cur(Some(STALE), false),
            FAILED,
        )
        .then(Some(STALE), false, Outcome::KeptOnError),
        case(
            "update lookup failed re-adds a dropped stamp",
            update(cur(Some(STALE), false)),
            none,
            FAILED,
        )
        .then(Some(STALE), false, Outcome::KeptOnError),
        case(
            "update lookup failed undoes a touch",
            update(cur(Some(STALE), false)),
            cur(e, false),
            FAILED,
        )
        .then(Some(STALE), false, Outcome::KeptOnError),
        case(
            "update lookup failed keeps the marker",
            update(cur(None, true)),
            none,
            FAILED,
        )
        .then(None, true, Outcome::KeptOnError),
        case(
            "watcher with failed lookup touches nothing",
            Trigger::ConfigChange,
            cur(Some(STALE), false),
            FAILED,
        )
        .then(Some(STALE), false, Outcome::KeptOnError),
        case(
            "reconcile resolves the marker",
            Trigger::Reconcile,
            cur(None, true),
            OK,
        ),
        case(
            "update resolves the marker",
            update(cur(None, true)),
            cur(None, true),
            OK,
        ),
        // Rule 2: a required reference is absent.
        case(
            "update keeps the stamp when a reference is absent",
            update(cur(Some(STALE), false)),
            cur(Some(STALE), false),
            ABSENT,
        )
        .then(Some(STALE), false, Outcome::KeptAbsent),
        case(
            "update re-adds the kept stamp",
            update(cur(Some(STALE), false)),
            none,
            ABSENT,
        )
        .then(Some(STALE), false, Outcome::KeptAbsent),
        case(
            "config change keeps the stamp when a reference is absent",
            Trigger::ConfigChange,
            cur(Some(STALE), false),
            ABSENT,
        )
        .then(Some(STALE), false, Outcome::KeptAbsent),
        case(
            "reconcile keeps the stamp when a reference is absent",
            Trigger::Reconcile,
            cur(Some(STALE), false),
            ABSENT,
        )
        .then(Some(STALE), false, Outcome::KeptAbsent),
        case(
            "roll-on-delete restamps",
            Trigger::ConfigChange,
            cur(Some(STALE), false),
            ABSENT,
        )
        .options(ROLL_ON_DELETE),
        case(
            "create with an absent reference stamps the absence",
            Trigger::Create,
            none,
            ABSENT,
        ),
        case(
            "marker with an absent reference is resolved",
            Trigger::Reconcile,
            cur(None, true),
            ABSENT,
        ),
        // Rule 3: foreign stamps and workloads never stamped.
        case(
            "update keeps a foreign key stamp",
            update(cur(Some(FOREIGN_KEY), false)),
            cur(Some(FOREIGN_KEY), false),
            OK,
        )
        .then(Some(FOREIGN_KEY), false, Outcome::KeptForeign),
        case(
            "update keeps a foreign recipe stamp",
            update(cur(Some(FOREIGN_RECIPE), false)),
            cur(Some(FOREIGN_RECIPE), false),
            OK,
        )
        .then(Some(FOREIGN_RECIPE), false, Outcome::KeptForeign),
        case(
            "update re-adds a dropped foreign stamp",
            update(cur(Some(FOREIGN_KEY), false)),
            none,
            OK,
        )
        .then(Some(FOREIGN_KEY), false, Outcome::KeptForeign),
        // Only an update that carries a new stamp (the watcher's touch) replaces a foreign one: a
        // template change cannot be told from a field another mutating webhook adds later.
        case(
            "a rollout restart replaces a foreign stamp",
            restart(cur(Some(FOREIGN_KEY), false)),
            cur(Some(FOREIGN_KEY), false),
            OK,
        ),
        case(
            "a rollout restart that drops a foreign stamp replaces it",
            restart(cur(Some(FOREIGN_KEY), false)),
            none,
            OK,
        ),
        case(
            "a rollout restart stamps a never-stamped workload",
            restart(none),
            none,
            OK,
        ),
        case(
            "a rollout restart writes v2 over a right v1 stamp",
            restart(cur(e1, false)),
            cur(e1, false),
            OK,
        ),
        case(
            "a rollout restart keeps a right stamp",
            restart(cur(e, false)),
            cur(e, false),
            OK,
        )
        .then(Some(EXPECTED), false, Outcome::Unchanged),
        case(
            "a rollout restart with a failed lookup keeps the old stamp",
            restart(cur(Some(FOREIGN_KEY), false)),
            none,
            FAILED,
        )
        .then(Some(FOREIGN_KEY), false, Outcome::KeptOnError),
        case(
            "an update carrying another foreign stamp is stamped",
            update(cur(Some(FOREIGN_KEY), false)),
            cur(Some(FOREIGN_RECIPE), false),
            OK,
        ),
        case(
            "touch replaces a foreign stamp",
            update(cur(Some(FOREIGN_KEY), false)),
            cur(e, false),
            OK,
        )
        .then(Some(EXPECTED), false, Outcome::Unchanged),
        case(
            "reconcile leaves a foreign stamp",
            Trigger::Reconcile,
            cur(Some(FOREIGN_KEY), false),
            OK,
        )
        .then(Some(FOREIGN_KEY), false, Outcome::KeptForeign),
        case(
            "config change replaces a foreign stamp",
            Trigger::ConfigChange,
            cur(Some(FOREIGN_KEY), false),
            OK,
        ),
        case(
            "malformed stamp is foreign",
            Trigger::Reconcile,
            cur(Some("v2:3eb1bd43:XYZ"), false),
            OK,
        )
        .then(Some("v2:3eb1bd43:XYZ"), false, Outcome::KeptForeign),
        case(
            "malformed v1 stamp is foreign",
            Trigger::Reconcile,
            cur(Some("v1:3eb1bd43:XYZ"), false),
            OK,
        )
        .then(Some("v1:3eb1bd43:XYZ"), false, Outcome::KeptForeign),
        case(
            "update leaves a never-stamped workload",
            update(none),
            none,
            OK,
        )
        .then(None, false, Outcome::KeptUnstamped),
        case(
            "a touch stamps a never-stamped workload",
            update(none),
            cur(Some(STALE), false),
            OK,
        ),
        case(
            "reconcile leaves a never-stamped workload",
            Trigger::Reconcile,
            none,
            OK,
        )
        .then(None, false, Outcome::KeptUnstamped),
        case("stamp-existing stamps it", Trigger::Reconcile, none, OK).options(STAMP_EXISTING),
        case(
            "stamp-existing leaves foreign stamps",
            Trigger::Reconcile,
            cur(Some(FOREIGN_KEY), false),
            OK,
        )
        .options(STAMP_EXISTING)
        .then(Some(FOREIGN_KEY), false, Outcome::KeptForeign),
        case(
            "config change stamps a never-stamped workload",
            Trigger::ConfigChange,
            none,
            OK,
        ),
        // Recipe v1 stamps made with the current key: checked under v1, kept while right,
        // replaced by the v2 stamp when stale.
        case(
            "reconcile keeps a right v1 stamp",
            Trigger::Reconcile,
            cur(e1, false),
            OK,
        )
        .then(Some(EXPECTED_V1), false, Outcome::Unchanged),
        case(
            "reconcile replaces a stale v1 stamp",
            Trigger::Reconcile,
            cur(Some(STALE_V1), false),
            OK,
        ),
        case(
            "stamp-existing keeps a right v1 stamp",
            Trigger::Reconcile,
            cur(e1, false),
            OK,
        )
        .options(STAMP_EXISTING)
        .then(Some(EXPECTED_V1), false, Outcome::Unchanged),
        case(
            "config change keeps a right v1 stamp",
            Trigger::ConfigChange,
            cur(e1, false),
            OK,
        )
        .then(Some(EXPECTED_V1), false, Outcome::Unchanged),
        case(
            "config change replaces a stale v1 stamp",
            Trigger::ConfigChange,
            cur(Some(STALE_V1), false),
            OK,
        ),
        case(
            "update keeps a right v1 stamp",
            update(cur(e1, false)),
            cur(e1, false),
            OK,
        )
        .then(Some(EXPECTED_V1), false, Outcome::Unchanged),
        case(
            "update re-adds a dropped right v1 stamp",
            update(cur(e1, false)),
            none,
            OK,
        )
        .then(Some(EXPECTED_V1), false, Outcome::Stamped),
        case(
            "update undoes a touch of a right v1 stamp",
            update(cur(e1, false)),
            cur(e, false),
            OK,
        )
        .then(Some(EXPECTED_V1), false, Outcome::Stamped),
        case(
            "update puts a right v1 stamp back over another",
            update(cur(e1, false)),
            cur(Some(STALE_V1), false),
            OK,
        )
        .then(Some(EXPECTED_V1), false, Outcome::Stamped),
        case(
            "update replaces a stale v1 stamp",
            update(cur(Some(STALE_V1), false)),
            cur(Some(STALE_V1), false),
            OK,
        ),
        case(
            "update replaces a dropped stale v1 stamp",
            update(cur(Some(STALE_V1), false)),
            none,
            OK,
        ),
        case(
            "touch replaces a stale v1 stamp",
            update(cur(Some(STALE_V1), false)),
            cur(e, false),
            OK,
        )
        .then(Some(EXPECTED), false, Outcome::Unchanged),
        case(
            "a v1 stamp put back over a v2 stamp gives the v2 stamp",
            update(cur(e, false)),
            cur(e1, false),
            OK,
        ),
        case(
            "create replaces a copied right v1 stamp",
            Trigger::Create,
            cur(e1, false),
            OK,
        ),
        case(
            "update lookup failed keeps a v1 stamp",
            update(cur(Some(STALE_V1), false)),
            cur(e, false),
            FAILED,
        )
        .then(Some(STALE_V1), false, Outcome::KeptOnError),
        case(
            "config change keeps a stale v1 stamp when a reference is absent",
            Trigger::ConfigChange,
            cur(Some(STALE_V1), false),
            ABSENT,
        )
        .then(Some(STALE_V1), false, Outcome::KeptAbsent),
        case(
            "reconcile keeps a stale v1 stamp when a reference is absent",
            Trigger::Reconcile,
            cur(Some(STALE_V1), false),
            ABSENT,
        )
        .then(Some(STALE_V1), false, Outcome::KeptAbsent),
        case(
            "update keeps a stale v1 stamp when a reference is absent",
            update(cur(Some(STALE_V1), false)),
            none,
            ABSENT,
        )
        .then(Some(STALE_V1), false, Outcome::KeptAbsent),
        case(
            "roll-on-delete replaces a stale v1 stamp",
            Trigger::ConfigChange,
            cur(Some(STALE_V1), false),
            ABSENT,
        )
        .options(ROLL_ON_DELETE),
        case(
            "roll-on-delete keeps a right v1 stamp",
            Trigger::ConfigChange,
            cur(e1, false),
            ABSENT,
        )
        .options(ROLL_ON_DELETE)
        .then(Some(EXPECTED_V1), false, Outcome::Unchanged),
        case(
            "a marker beside a right v1 stamp is resolved with v2",
            Trigger::Reconcile,
            cur(e1, true),
            OK,
        ),
        case(
            "reconcile leaves a v1 stamp of another key",
            Trigger::Reconcile,
            cur(Some(FOREIGN_KEY_V1), false),
            OK,
        )
        .then(Some(FOREIGN_KEY_V1), false, Outcome::KeptForeign),
        case(
            "update keeps a v1 stamp of another key",
            update(cur(Some(FOREIGN_KEY_V1), false)),
            none,
            OK,
        )
        .then(Some(FOREIGN_KEY_V1), false, Outcome::KeptForeign),
        case(
            "config change replaces a v1 stamp of another key",
            Trigger::ConfigChange,
            cur(Some(FOREIGN_KEY_V1), false),
            OK,
        ),
        // Rule 4: opted out.
        case("opted out create", Trigger::Create, none, OK)
            .opted_out()
            .then(None, false, Outcome::Skipped),
        case(
            "opted out update keeps what it has",
            update(cur(Some(STALE), false)),
            cur(Some(FOREIGN_KEY), false),
            OK,
        )
        .opted_out()
        .then(Some(FOREIGN_KEY), false, Outcome::Skipped),
        case(
            "opted out update that drops the stamp gets the old one back",
            update(cur(Some(STALE), false)),
            none,
            OK,
        )
        .opted_out()
        .then(Some(STALE), false, Outcome::Skipped),
        case(
            "opted out update that drops the marker gets it back",
            update(cur(None, true)),
            none,
            FAILED,
        )
        .opted_out()
        .then(None, true, Outcome::Skipped),
        case(
            "opted out config change",
            Trigger::ConfigChange,
            cur(Some(STALE), false),
            OK,
        )
        .opted_out()
        .then(Some(STALE), false, Outcome::Skipped),
    ];
    let mut failures = Vec::new();
    for c in &cases {
        // As the callers do: the expected v1 stamp only when the rules need it.
        let with_v1 = needs_v1(c.trigger, c.current, key().id());
        let got = decide(
            c.trigger,
            c.current,
            c.opted_out,
            &lookup(c.lookup, with_v1),
            key().id(),
            c.options,
        );
        let want = Decision {
            stamp: c.stamp.map(|s| match s {
                EXPECTED => exp.clone(),
                EXPECTED_V1 => exp_v1.clone(),
                s => s.to_owned(),
            }),
            marker: c.marker,
            outcome: c.outcome,
        };
        if got != want {
            failures.push(format!("{}: got {got:?}, want {want:?}", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn changes_reports_only_real_differences() {
    let d = Decision {
        stamp: Some("s".into()),
        marker: false,
        outcome: Outcome::Unchanged,
    };
    assert!(!d.changes(cur(Some("s"), false)));
    assert!(d.changes(cur(Some("t"), false)));
    assert!(d.changes(cur(None, false)));
    assert!(d.changes(cur(Some("s"), true)));
}

#[test]
fn current_stamps_are_recognised() {
    let id = key().id().to_owned();
    assert!(checksum::is_current(&expected(), &id));
    assert!(checksum::is_current(STALE, &id));
    // v1 stamps of the current key are ours too: they are checked under v1.
    assert!(checksum::is_current(expected_v1_stamp().as_str(), &id));
    assert!(checksum::is_current(STALE_V1, &id));
    assert_eq!(Recipe::of_stamp(STALE_V1, &id), Some(Recipe::V1));
    assert_eq!(Recipe::of_stamp(STALE, &id), Some(Recipe::V2));
    assert_eq!(Recipe::of_stamp(FOREIGN_RECIPE, &id), None);
    assert!(!checksum::is_current(FOREIGN_KEY, &id));
    assert!(!checksum::is_current(FOREIGN_KEY_V1, &id));
    assert!(!checksum::is_current(FOREIGN_RECIPE, &id));
    assert!(!checksum::is_current(&format!("v{STALE}"), &id));
    assert!(!checksum::is_current(
        &STALE_V1.replacen("v1", "V1", 1),
        &id
    ));
    assert!(!checksum::is_current(&STALE_V1[..STALE_V1.len() - 1], &id));
    assert!(!checksum::is_current(&STALE.to_uppercase(), &id));
    assert!(!checksum::is_current(&STALE[..STALE.len() - 1], &id));
    assert!(!checksum::is_current(&format!("{STALE}0"), &id));
    assert!(!checksum::is_current("", &id));
}

#[test]
fn short_keys_are_refused() {
    assert!(StampKey::new(vec![0u8; 15]).is_err());
    assert!(StampKey::new(vec![0u8; 16]).is_ok());
    assert_eq!(key().id(), "3eb1bd43");
}

#[test]
fn the_v1_stamp_is_needed_only_to_check_a_v1_stamp_of_the_current_key() {
    let stamp_key = key();
    let id = stamp_key.id();
    let exp = expected();
    let e = Some(exp.as_str());
    let exp_v1 = expected_v1_stamp().to_string();
    let e1 = Some(exp_v1.as_str());
    let cases: [(&str, Trigger<'_>, Current<'_>, bool); 14] = [
        ("reconcile, v1", Trigger::Reconcile, cur(e1, false), true),
        (
            "reconcile, stale v1",
            Trigger::Reconcile,
            cur(Some(STALE_V1), false),
            true,
        ),
        (
            "config change, v1",
            Trigger::ConfigChange,
            cur(e1, false),
            true,
        ),
        ("reconcile, v2", Trigger::Reconcile, cur(e, false), false),
        (
            "reconcile, none",
            Trigger::Reconcile,
            cur(None, false),
            false,
        ),
        (
            "reconcile, v1 of another key",
            Trigger::Reconcile,
            cur(Some(FOREIGN_KEY_V1), false),
            false,
        ),
        (
            "reconcile, v1 with a marker",
            Trigger::Reconcile,
            cur(e1, true),
            false,
        ),
        (
            "create with a copied v1",
            Trigger::Create,
            cur(e1, false),
            false,
        ),
        (
            "passive update, old v1",
            update(cur(e1, false)),
            cur(e, false),
            true,
        ),
        (
            "passive update, old v1, dropped",
            update(cur(e1, false)),
            cur(None, false),
            true,
        ),
        (
            "rollout restart, old v1",
            restart(cur(e1, false)),
            cur(e1, false),
            false,
        ),
        (
            "passive update, old v2, new v1",
            update(cur(e, false)),
            cur(e1, false),
            false,
        ),
        (
            "passive update, old none, new v1",
            update(cur(None, false)),
            cur(e1, false),
            false,
        ),
        (
            "passive update, old v1 with a marker",
            update(cur(e1, true)),
            cur(e1, false),
            false,
        ),
    ];
    for (name, trigger, current, want) in cases {
        assert_eq!(needs_v1(trigger, current, id), want, "{name}");
    }
}

/// A caller that does not supply the expected v1 stamp when it is needed gets the foreign-stamp
/// rule (kept on passive paths, replaced at a config change): never a rollout it did not ask for.
#[test]
fn a_v1_stamp_without_its_expected_v1_stamp_is_treated_as_foreign() {
    let stamp_key = key();
    let id = stamp_key.id();
    let v1 = expected_v1_stamp().to_string();
    let without = lookup(OK, false);
    let reconcile = decide(
        Trigger::Reconcile,
        cur(Some(&v1), false),
        false,
        &without,
        id,
        NONE,
    );
    assert_eq!(reconcile.stamp.as_deref(), Some(v1.as_str()));
    assert_eq!(reconcile.outcome, Outcome::KeptForeign);
    let passive = decide(
        update(cur(Some(&v1), false)),
        cur(None, false),
        false,
        &without,
        id,
        NONE,
    );
    assert_eq!(passive.stamp.as_deref(), Some(v1.as_str()));
    assert_eq!(passive.outcome, Outcome::KeptForeign);
    let change = decide(
        Trigger::ConfigChange,
        cur(Some(&v1), false),
        false,
        &without,
        id,
        NONE,
    );
    assert_eq!(change.stamp, Some(expected()));
}

/// Over `--max-reference-bytes` is rule 1 with its own outcome: every trigger keeps what the
/// workload had (a CREATE gets the marker), and a marked workload is stamped once its references
/// fit (the lookup resolves).
#[test]
fn references_over_max_reference_bytes_keep_the_stamp_and_mark_a_create() {
    let stamp_key = key();
    let id = stamp_key.id();
    let too_large = Lookup::TooLarge { bytes: 17 << 20 };
    let create = decide(
        Trigger::Create,
        cur(None, false),
        false,
        &too_large,
        id,
        NONE,
    );
    assert_eq!((create.stamp, create.marker), (None, true));
    assert_eq!(create.outcome, Outcome::KeptTooLarge);
    assert_eq!(Outcome::KeptTooLarge.as_str(), "too-large");
    let old = expected();
    for trigger in [
        update(cur(Some(STALE), false)),
        Trigger::ConfigChange,
        Trigger::Reconcile,
    ] {
        let current = match trigger {
            Trigger::Update { .. } => cur(Some(&old), false),
            _ => cur(Some(STALE), false),
        };
        let d = decide(trigger, current, false, &too_large, id, NONE);
        assert_eq!(d.stamp.as_deref(), Some(STALE), "{trigger:?}");
        assert!(!d.marker, "{trigger:?}");
        assert_eq!(d.outcome, Outcome::KeptTooLarge, "{trigger:?}");
    }
    // Reconcile leaves the marker while it is too large, and resolves it once it fits.
    let marked = cur(None, true);
    let kept = decide(Trigger::Reconcile, marked, false, &too_large, id, NONE);
    assert!(!kept.changes(marked));
    let fits = decide(
        Trigger::Reconcile,
        marked,
        false,
        &lookup(OK, false),
        id,
        NONE,
    );
    assert_eq!((fits.stamp, fits.marker), (Some(expected()), false));
}

/// The limit counts the decoded bytes of every referenced object that exists and is not
/// ignored, each once; `expected` says `TooLarge` only past it.
#[test]
fn the_limit_counts_present_objects_each_once() {
    use confighash::core::checksum::{ObjectDigest, RefState, Tag};
    use confighash::core::refs::ObjectRef;
    use confighash::core::rules::{View, expected as expected_of, reference_bytes};
    struct Sized;
    impl View for Sized {
        fn state(&self, object: &ObjectRef) -> RefState<'_> {
            static BIG: std::sync::OnceLock<ObjectDigest> = std::sync::OnceLock::new();
            match object.name.as_str() {
                "ignored" => RefState::Ignored,
                "absent" => RefState::Absent,
                _ => RefState::Present(BIG.get_or_init(|| {
                    ObjectDigest::from_digests([("k".to_owned(), Tag::Data, [0; 32])])
                        .with_bytes(1000)
                })),
            }
        }
    }
    let mut refs = References::default();
    for (kind, name) in [
        (ObjectKind::ConfigMap, "a"),
        (ObjectKind::Secret, "a"),
        (ObjectKind::ConfigMap, "ignored"),
        (ObjectKind::Secret, "absent"),
    ] {
        refs.add(kind, name, Selection::Whole, true);
    }
    // The same object named twice (by key and whole) counts once.
    refs.add(
        ObjectKind::ConfigMap,
        "a",
        Selection::Keys(["k".to_owned()].into()),
        true,
    );
    assert_eq!(reference_bytes(&Sized, &refs), 2000);
    let k = key();
    assert!(matches!(
        expected_of(&Sized, Some(&k), NS, &refs, false, 2000),
        Lookup::Resolved { .. }
    ));
    assert_eq!(
        expected_of(&Sized, Some(&k), NS, &refs, false, 1999),
        Lookup::TooLarge { bytes: 2000 }
    );
}

// ---------------------------------------------------------------------------------------------
// Properties: what the expected v1 stamp may change, and the upgrade from recipe v1

/// The stamps a workload may carry in the properties below.
fn pool() -> Vec<Option<String>> {
    vec![
        None,
        Some(expected()),
        Some(expected_v1_stamp().to_string()),
        Some(STALE.to_owned()),
        Some(STALE_V1.to_owned()),
        Some(FOREIGN_KEY.to_owned()),
        Some(FOREIGN_KEY_V1.to_owned()),
        Some(FOREIGN_RECIPE.to_owned()),
    ]
}

fn any_trigger(
    pool: &[Option<String>],
    old: usize,
    old_marker: bool,
    restart: bool,
    which: u8,
) -> Trigger<'_> {
    let old = Current {
        stamp: pool[old].as_deref(),
        marker: old_marker,
    };
    match which {
        0 => Trigger::Create,
        1 => Trigger::Update { old, restart },
        2 => Trigger::ConfigChange,
        _ => Trigger::Reconcile,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `decide` reads the expected v1 stamp only when `needs_v1` says so, and it never writes a
    /// v1 stamp that the workload did not already carry.
    #[test]
    fn the_v1_stamp_matters_only_when_needed_and_is_never_written_anew(
        which in 0u8..4,
        old in 0usize..8,
        old_marker in any::<bool>(),
        restart in any::<bool>(),
        new in 0usize..8,
        marker in any::<bool>(),
        state in 0u8..3,
        opted_out in any::<bool>(),
        roll_on_delete in any::<bool>(),
        stamp_existing in any::<bool>(),
    ) {
        let stamp_key = key();
        let id = stamp_key.id();
        let pool = pool();
        let trigger = any_trigger(&pool, old, old_marker, restart, which);
        let current = cur(pool[new].as_deref(), marker);
        let options = Options { roll_on_delete, stamp_existing };
        let needed = needs_v1(trigger, current, id);
        let with = decide(trigger, current, opted_out, &lookup(state, true), id, options);
        let without = decide(trigger, current, opted_out, &lookup(state, false), id, options);
        if !needed {
            prop_assert_eq!(&with, &without);
        }
        if let Some(stamp) = with.stamp.as_deref()
            && stamp.starts_with("v1:")
        {
            let old_stamp = match trigger {
                Trigger::Update { old, .. } => old.stamp,
                _ => None,
            };
            prop_assert!(
                Some(stamp) == current.stamp || Some(stamp) == old_stamp,
                "wrote a new v1 stamp: {:?}", with
            );
        }
    }

    /// Case 4: an UPDATE that neither carries a new stamp nor restarts the rollout (a `kubectl
    /// replace` of the git manifest, whatever else it changes, and whatever another webhook adds)
    /// never changes a stamp that is right, foreign or missing, whatever the lookup gives: only a
    /// stale stamp of the current key (whose config changed) is replaced.
    #[test]
    fn an_update_without_a_new_stamp_changes_no_stamp_that_is_not_stale(
        old in prop::sample::select(vec![0usize, 1, 2, 5, 6, 7]),
        dropped in any::<bool>(),
        state in 0u8..3,
        opted_out in any::<bool>(),
        roll_on_delete in any::<bool>(),
        stamp_existing in any::<bool>(),
    ) {
        let stamp_key = key();
        let id = stamp_key.id();
        let pool = pool();
        let trigger = any_trigger(&pool, old, false, false, 1);
        let current = cur(if dropped { None } else { pool[old].as_deref() }, false);
        let options = Options { roll_on_delete, stamp_existing };
        let lookup = lookup(state, needs_v1(trigger, current, id));
        let decision = decide(trigger, current, opted_out, &lookup, id, options);
        prop_assert_eq!(decision.stamp.as_deref(), pool[old].as_deref(), "{:?}", decision);
        prop_assert!(!decision.marker);
    }

    /// The upgrade, as a run of events on one workload that carries the right v1 stamp when the
    /// new version starts: the watcher (which may lag behind the API server) reconciles and
    /// reacts to config changes, the webhook answers its touches and other updates (with fresh
    /// reads, or a failed lookup). With no config change nothing rolls, ever; with one config
    /// change the workload rolls exactly once, and ends on the v2 stamp of the new content.
    #[test]
    fn upgrading_rolls_nothing_and_a_change_during_it_rolls_once(
        events in proptest::collection::vec(0u8..8, 0..24),
    ) {
        let mut run = Upgrade::new();
        for e in &events {
            run.event(*e);
        }
        // Things settle: the watcher catches up and reconciles, and something updates the workload.
        run.event(WATCHER_CATCHES_UP);
        run.event(RECONCILE);
        run.event(SCALE);
        let changed = events.contains(&CHANGE);
        prop_assert_eq!(run.rollouts, usize::from(changed), "{:?}", run);
        let want = if changed { &run.v2[1] } else { &run.v1[0] };
        prop_assert_eq!(run.stamp.as_deref(), Some(want.as_str()));
    }
}

const CHANGE: u8 = 0;
const SCALE: u8 = 1;
const APPLY_WITHOUT_STAMP: u8 = 2;
const RECONCILE: u8 = 3;
const CONFIG_CHANGE: u8 = 4;
const WATCHER_CATCHES_UP: u8 = 5;
const TOUCH_WEBHOOK_FAILS: u8 = 6;

/// One workload referencing ConfigMap `app-env`, whose content is version 0 or 1.
#[derive(Debug)]
struct Upgrade {
    /// The expected stamps of content 0 and 1, under v2 and v1.
    v2: [Stamp; 2],
    v1: [Stamp; 2],
    /// The content the API server holds, and the one the watcher has seen.
    content: usize,
    watcher_content: usize,
    stamp: Option<String>,
    rollouts: usize,
}

impl Upgrade {
    fn new() -> Self {
        let mut refs = References::default();
        refs.add(ObjectKind::ConfigMap, "app-env", Selection::Whole, false);
        let digest = |c: u8| {
            checksum::ObjectDigest::from_digests([(
                "LOG_LEVEL".to_owned(),
                checksum::Tag::Data,
                [c; 32],
            )])
        };
        let contents = [digest(0), digest(1)];
        let v2 = [0, 1].map(|c| {
            checksum::compute_stamp(Some(&key()), NS, &refs, |_| {
                checksum::RefState::Present(&contents[c])
            })
        });
        let v1 = [0, 1].map(|c| {
            checksum::compute_stamp_v1(Some(&key()), &refs, |_| {
                checksum::RefState::Present(&contents[c])
            })
        });
        Upgrade {
            stamp: Some(v1[0].to_string()),
            v2,
            v1,
            content: 0,
            watcher_content: 0,
            rollouts: 0,
        }
    }

    fn lookup(&self, content: usize, with_v1: bool) -> Lookup {
        Lookup::Resolved {
            expected: self.v2[content].clone(),
            expected_v1: with_v1.then(|| self.v1[content].clone()),
            required_absent: false,
        }
    }

    /// The API server sends an UPDATE that leaves the template alone but sets the stamp to `new`
    /// through the webhook, and stores what it answers.
    fn webhook_update(&mut self, new: Option<String>, lookup_fails: bool) {
        let old = self.stamp.clone();
        let trigger = update(cur(old.as_deref(), false));
        let current = cur(new.as_deref(), false);
        let lookup = if lookup_fails {
            Lookup::Failed
        } else {
            self.lookup(self.content, needs_v1(trigger, current, key().id()))
        };
        let decision = decide(trigger, current, false, &lookup, key().id(), NONE);
        if decision.stamp != old {
            self.rollouts += 1;
        }
        self.stamp = decision.stamp;
    }

    fn watcher(&mut self, trigger: Trigger<'static>, webhook_fails: bool) {
        let stamp = self.stamp.clone();
        let current = cur(stamp.as_deref(), false);
        let lookup = self.lookup(self.watcher_content, needs_v1(trigger, current, key().id()));
        let decision = decide(trigger, current, false, &lookup, key().id(), NONE);
        if decision.changes(current) {
            self.webhook_update(decision.stamp, webhook_fails);
        }
    }

    fn event(&mut self, e: u8) {
        match e {
            CHANGE => self.content = 1,
            SCALE => self.webhook_update(self.stamp.clone(), false),
            APPLY_WITHOUT_STAMP => self.webhook_update(None, false),
            RECONCILE => self.watcher(Trigger::Reconcile, false),
            CONFIG_CHANGE => self.watcher(Trigger::ConfigChange, false),
            WATCHER_CATCHES_UP => self.watcher_content = self.content,
            TOUCH_WEBHOOK_FAILS => self.watcher(Trigger::Reconcile, true),
            _ => self.watcher(Trigger::ConfigChange, true),
        }
    }
}
