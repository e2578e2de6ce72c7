//! The stamp rules of DESIGN "When a stamp changes", one table row per case.

use confighash::checksum::{self, StampKey};
use confighash::refs::References;
use confighash::rules::{Current, Decision, Lookup, Options, Outcome, Trigger, decide};

fn key() -> StampKey {
    StampKey::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap()
}

/// The expected stamp of a workload without references, made with the current key.
fn expected() -> String {
    checksum::compute_stamp(Some(&key()), &References::default(), |_| {
        checksum::RefState::Absent
    })
    .to_string()
}

/// A stamp made with the current key over other content (stale digest).
const STALE: &str = "v1:3eb1bd43:0000000000000000000000000000000000000000000000000000000000000000";
/// A stamp made with another key.
const FOREIGN_KEY: &str =
    "v1:deadbeef:1111111111111111111111111111111111111111111111111111111111111111";
/// A stamp made by another recipe version.
const FOREIGN_RECIPE: &str =
    "v2:3eb1bd43:2222222222222222222222222222222222222222222222222222222222222222";

const OK: u8 = 0;
const ABSENT: u8 = 1;
const FAILED: u8 = 2;

fn lookup(state: u8) -> Lookup {
    match state {
        FAILED => Lookup::Failed,
        s => Lookup::Resolved {
            expected: checksum::compute_stamp(Some(&key()), &References::default(), |_| {
                checksum::RefState::Absent
            }),
            required_absent: s == ABSENT,
        },
    }
}

fn cur(stamp: Option<&str>, marker: bool) -> Current<'_> {
    Current { stamp, marker }
}

fn update<'a>(old: Current<'a>, template_unchanged: bool) -> Trigger<'a> {
    Trigger::Update {
        old,
        template_unchanged,
    }
}

struct Case<'a> {
    name: &'a str,
    trigger: Trigger<'a>,
    current: Current<'a>,
    lookup: u8,
    opted_out: bool,
    options: Options,
    /// The stamp the workload must carry afterwards ("EXPECTED" for the expected stamp).
    stamp: Option<&'a str>,
    marker: bool,
    outcome: Outcome,
}

const EXPECTED: &str = "EXPECTED";
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
            "update with a template change restamps",
            update(cur(Some(STALE), false), false),
            cur(Some(STALE), false),
            OK,
        ),
        case(
            "update restores a dropped stamp",
            update(cur(e, false), true),
            none,
            OK,
        ),
        case(
            "update corrects a stale digest",
            update(cur(Some(STALE), false), true),
            cur(Some(STALE), false),
            OK,
        ),
        case(
            "update already right gives no change",
            update(cur(e, false), true),
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
            update(cur(Some(STALE), false), false),
            cur(Some(STALE), false),
            FAILED,
        )
        .then(Some(STALE), false, Outcome::KeptOnError),
        case(
            "update lookup failed re-adds a dropped stamp",
            update(cur(Some(STALE), false), false),
            none,
            FAILED,
        )
        .then(Some(STALE), false, Outcome::KeptOnError),
        case(
            "update lookup failed undoes a touch",
            update(cur(Some(STALE), false), true),
            cur(e, false),
            FAILED,
        )
        .then(Some(STALE), false, Outcome::KeptOnError),
        case(
            "update lookup failed keeps the marker",
            update(cur(None, true), true),
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
            update(cur(None, true), true),
            cur(None, true),
            OK,
        ),
        // Rule 2: a required reference is absent.
        case(
            "update keeps the stamp when a reference is absent",
            update(cur(Some(STALE), false), false),
            cur(Some(STALE), false),
            ABSENT,
        )
        .then(Some(STALE), false, Outcome::KeptAbsent),
        case(
            "update re-adds the kept stamp",
            update(cur(Some(STALE), false), true),
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
            update(cur(Some(FOREIGN_KEY), false), true),
            cur(Some(FOREIGN_KEY), false),
            OK,
        )
        .then(Some(FOREIGN_KEY), false, Outcome::KeptForeign),
        case(
            "update keeps a foreign recipe stamp",
            update(cur(Some(FOREIGN_RECIPE), false), true),
            cur(Some(FOREIGN_RECIPE), false),
            OK,
        )
        .then(Some(FOREIGN_RECIPE), false, Outcome::KeptForeign),
        case(
            "update re-adds a dropped foreign stamp",
            update(cur(Some(FOREIGN_KEY), false), true),
            none,
            OK,
        )
        .then(Some(FOREIGN_KEY), false, Outcome::KeptForeign),
        case(
            "template change replaces a foreign stamp",
            update(cur(Some(FOREIGN_KEY), false), false),
            cur(Some(FOREIGN_KEY), false),
            OK,
        ),
        case(
            "touch replaces a foreign stamp",
            update(cur(Some(FOREIGN_KEY), false), true),
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
            cur(Some("v1:3eb1bd43:XYZ"), false),
            OK,
        )
        .then(Some("v1:3eb1bd43:XYZ"), false, Outcome::KeptForeign),
        case(
            "update leaves a never-stamped workload",
            update(none, true),
            none,
            OK,
        )
        .then(None, false, Outcome::KeptUnstamped),
        case(
            "template change stamps a never-stamped workload",
            update(none, false),
            none,
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
        // Rule 4: opted out.
        case("opted out create", Trigger::Create, none, OK)
            .opted_out()
            .then(None, false, Outcome::Skipped),
        case(
            "opted out update keeps what it has",
            update(cur(Some(STALE), false), false),
            cur(Some(FOREIGN_KEY), false),
            OK,
        )
        .opted_out()
        .then(Some(FOREIGN_KEY), false, Outcome::Skipped),
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
        let got = decide(
            c.trigger,
            c.current,
            c.opted_out,
            &lookup(c.lookup),
            key().id(),
            c.options,
        );
        let want = Decision {
            stamp: c.stamp.map(|s| {
                if s == EXPECTED {
                    exp.clone()
                } else {
                    s.to_owned()
                }
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
    assert!(!checksum::is_current(FOREIGN_KEY, &id));
    assert!(!checksum::is_current(FOREIGN_RECIPE, &id));
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
