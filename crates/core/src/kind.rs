//! Workload kinds: the five built in, and kinds added with `--workload-kind
//! GROUP/VERSION/KIND=POINTER` (a CRD whose objects carry a pod template at the JSON pointer).
//!
//! A [`WorkloadKind`] is a small copyable handle. The built-in kinds are constants; a configured
//! kind is made once, from its flag, by [`WorkloadKind::parse`], and lives as long as the process
//! (the same flag value gives the same kind again, so a process configured many times, as the
//! tests are, keeps one of each). Which kinds an instance handles is a [`Kinds`]: the built-in
//! kinds and those configured for it, so two instances in one process can handle different kinds.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What confighash knows of a kind: where its API is and where its objects' pod template is.
#[derive(Debug, PartialEq, Eq)]
pub struct KindSpec {
    /// Unique per kind in a process: the built-in kinds are 0..5, configured kinds follow in the
    /// order they were first configured. Kinds sort by it.
    id: u16,
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    /// The pointer's tokens, unescaped.
    template: &'static [&'static str],
}

/// A kind of workload confighash stamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadKind(&'static KindSpec);

impl Hash for WorkloadKind {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Ids are unique per kind: equal ids are equal kinds.
        self.0.id.hash(state);
    }
}

impl PartialOrd for WorkloadKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for WorkloadKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.id.cmp(&other.0.id)
    }
}

const SPEC_TEMPLATE: &[&str] = &["spec", "template"];

impl WorkloadKind {
    pub const DEPLOYMENT: WorkloadKind = WorkloadKind(&KindSpec {
        id: 0,
        group: "apps",
        version: "v1",
        kind: "Deployment",
        template: SPEC_TEMPLATE,
    });
    pub const STATEFUL_SET: WorkloadKind = WorkloadKind(&KindSpec {
        id: 1,
        group: "apps",
        version: "v1",
        kind: "StatefulSet",
        template: SPEC_TEMPLATE,
    });
    pub const DAEMON_SET: WorkloadKind = WorkloadKind(&KindSpec {
        id: 2,
        group: "apps",
        version: "v1",
        kind: "DaemonSet",
        template: SPEC_TEMPLATE,
    });
    pub const CRON_JOB: WorkloadKind = WorkloadKind(&KindSpec {
        id: 3,
        group: "batch",
        version: "v1",
        kind: "CronJob",
        template: &["spec", "jobTemplate", "spec", "template"],
    });
    /// Argo Rollouts' Rollout.
    pub const ROLLOUT: WorkloadKind = WorkloadKind(&KindSpec {
        id: 4,
        group: "argoproj.io",
        version: "v1alpha1",
        kind: "Rollout",
        template: SPEC_TEMPLATE,
    });

    /// The kinds handled without configuration, in the order waves sort them.
    pub const BUILT_IN: [WorkloadKind; 5] = [
        WorkloadKind::DEPLOYMENT,
        WorkloadKind::STATEFUL_SET,
        WorkloadKind::DAEMON_SET,
        WorkloadKind::CRON_JOB,
        WorkloadKind::ROLLOUT,
    ];

    /// The built-in kind of an API group and kind (`apps`, `Deployment`); any served version is
    /// accepted. Configured kinds are found through [`Kinds::find`].
    pub fn built_in(group: &str, kind: &str) -> Option<Self> {
        WorkloadKind::BUILT_IN
            .into_iter()
            .find(|k| k.group() == group && k.kind() == kind)
    }

    /// A configured kind from its flag value, `GROUP/VERSION/KIND=POINTER`
    /// (`apps.kruise.io/v1alpha1/CloneSet=/spec/template`).
    pub fn parse(flag: &str) -> Result<WorkloadKind, KindError> {
        let (gvk, pointer) = flag.split_once('=').ok_or(KindError::Form)?;
        let mut parts = gvk.split('/');
        let (Some(group), Some(version), Some(kind), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(KindError::Form);
        };
        if let Some((_, _, why)) = REFUSED.iter().find(|(g, k, _)| *g == group && *k == kind) {
            return Err(KindError::Refused(kind_static(kind), why));
        }
        if !is_group(group) {
            return Err(KindError::Group);
        }
        if !is_version(version) {
            return Err(KindError::Version);
        }
        if !is_kind(kind) {
            return Err(KindError::Kind);
        }
        if let Some(built_in) = WorkloadKind::built_in(group, kind) {
            return Err(KindError::BuiltIn(built_in));
        }
        let tokens = pointer_tokens(pointer)?;
        if tokens
            .iter()
            .any(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) || t == "-")
        {
            return Err(KindError::ArrayIndex);
        }
        intern(group, version, kind, tokens)
    }

    pub fn group(self) -> &'static str {
        self.0.group
    }

    /// The API version confighash reads and writes the kind at (`v1`, `v1alpha1`).
    pub fn version(self) -> &'static str {
        self.0.version
    }

    /// `group/version`, as objects' `apiVersion` spells it.
    pub fn api_version(self) -> String {
        format!("{}/{}", self.0.group, self.0.version)
    }

    pub fn kind(self) -> &'static str {
        self.0.kind
    }

    /// Whether the kind is one of [`WorkloadKind::BUILT_IN`].
    pub fn is_built_in(self) -> bool {
        usize::from(self.0.id) < WorkloadKind::BUILT_IN.len()
    }

    /// The path of the pod template inside the object, as keys.
    pub fn template_path(self) -> &'static [&'static str] {
        self.0.template
    }

    /// The path of the pod template as a JSON pointer (`/spec/template`).
    pub fn template_pointer(self) -> String {
        self.0
            .template
            .iter()
            .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
            .collect()
    }

    /// The flag value that configures this kind, `GROUP/VERSION/KIND=POINTER`.
    pub fn flag(self) -> String {
        format!(
            "{}/{}/{}={}",
            self.0.group,
            self.0.version,
            self.0.kind,
            self.template_pointer()
        )
    }
}

impl std::fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

/// Why a `--workload-kind` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KindError {
    #[error(
        "expected GROUP/VERSION/KIND=POINTER, as apps.kruise.io/v1alpha1/CloneSet=/spec/template"
    )]
    Form,
    #[error("the API group must be a lower-case DNS subdomain (as apps.kruise.io)")]
    Group,
    #[error("the version must be a lower-case DNS label (as v1alpha1)")]
    Version,
    #[error("the kind must be a letter followed by letters and digits, at most 63 (as CloneSet)")]
    Kind,
    #[error("{0} is built in: its pod template is found without configuration")]
    BuiltIn(WorkloadKind),
    #[error(
        "the pointer must be a JSON pointer to the pod template, of 1 to {MAX_POINTER_TOKENS} \
         non-empty keys (as /spec/template; ~0 and ~1 escape ~ and /)"
    )]
    Pointer,
    #[error(
        "a pointer key may not be a number: a pod template inside an array cannot be found \
         there (each item is its own template)"
    )]
    ArrayIndex,
    #[error("{0}: {1}")]
    Refused(&'static str, &'static str),
    #[error("{0}/{1} is configured twice")]
    Twice(String, String),
    #[error("too many workload kinds configured (at most {MAX_CONFIGURED})")]
    TooMany,
}

/// Kinds whose pod template confighash must never stamp, by group and kind, with why.
const REFUSED: [(&str, &str, &str); 4] = [
    (
        "batch",
        "Job",
        "a Job's pod template is immutable: a touch would be refused (stamp its CronJob, or let \
         the webhook stamp each new Job)",
    ),
    (
        "apps",
        "ReplicaSet",
        "a ReplicaSet's template belongs to its Deployment (or Rollout): stamp that one",
    ),
    (
        "",
        "Pod",
        "a Pod is not a workload with a pod template: its spec cannot be rolled",
    ),
    (
        "core",
        "Pod",
        "a Pod is not a workload with a pod template: its spec cannot be rolled",
    ),
];

/// The name of a refused kind as a static string, for its error.
fn kind_static(kind: &str) -> &'static str {
    REFUSED
        .iter()
        .find(|(_, k, _)| *k == kind)
        .map_or("this kind", |(_, k, _)| k)
}

/// The most kinds one process configures.
pub const MAX_CONFIGURED: usize = 256;
/// The most keys in a pod template's pointer.
pub const MAX_POINTER_TOKENS: usize = 16;

/// An API group: a lower-case DNS-1123 subdomain.
fn is_group(s: &str) -> bool {
    crate::refs::is_object_name(s)
}

/// A version: a lower-case DNS-1123 label.
fn is_version(s: &str) -> bool {
    crate::refs::is_namespace_name(s)
}

fn is_kind(s: &str) -> bool {
    let mut bytes = s.bytes();
    s.len() <= 63
        && bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric())
}

/// The unescaped keys of a JSON pointer (RFC 6901); an empty key, a `~` not followed by `0` or
/// `1`, or more than [`MAX_POINTER_TOKENS`] keys are refused.
fn pointer_tokens(pointer: &str) -> Result<Vec<String>, KindError> {
    let rest = pointer.strip_prefix('/').ok_or(KindError::Pointer)?;
    let raw: Vec<&str> = rest.split('/').collect();
    if raw.len() > MAX_POINTER_TOKENS {
        return Err(KindError::Pointer);
    }
    raw.into_iter()
        .map(|token| {
            let mut out = String::new();
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                match c {
                    '~' => match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return Err(KindError::Pointer),
                    },
                    c if c.is_control() => return Err(KindError::Pointer),
                    c => out.push(c),
                }
            }
            if out.is_empty() || out.len() > 253 {
                return Err(KindError::Pointer);
            }
            Ok(out)
        })
        .collect()
}

/// The configured kinds of this process, each made once.
static CONFIGURED: Mutex<Vec<&'static KindSpec>> = Mutex::new(Vec::new());
/// How many kinds [`CONFIGURED`] holds, read without its lock.
static CONFIGURED_COUNT: AtomicUsize = AtomicUsize::new(0);

fn intern(
    group: &str,
    version: &str,
    kind: &str,
    template: Vec<String>,
) -> Result<WorkloadKind, KindError> {
    let mut configured = CONFIGURED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(spec) = configured.iter().find(|s| {
        s.group == group
            && s.version == version
            && s.kind == kind
            && s.template.iter().eq(template.iter())
    }) {
        return Ok(WorkloadKind(spec));
    }
    if configured.len() >= MAX_CONFIGURED {
        return Err(KindError::TooMany);
    }
    let leak = |s: &str| -> &'static str { Box::leak(s.to_owned().into_boxed_str()) };
    let template: Vec<&'static str> = template.iter().map(|t| leak(t)).collect();
    let id = u16::try_from(WorkloadKind::BUILT_IN.len() + configured.len())
        .map_err(|_| KindError::TooMany)?;
    let spec: &'static KindSpec = Box::leak(Box::new(KindSpec {
        id,
        group: leak(group),
        version: leak(version),
        kind: leak(kind),
        template: Box::leak(template.into_boxed_slice()),
    }));
    configured.push(spec);
    CONFIGURED_COUNT.store(configured.len(), Ordering::Release);
    Ok(WorkloadKind(spec))
}

/// The kinds one instance handles: the built-in kinds, then its configured kinds. Cheap to
/// clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kinds(Arc<[WorkloadKind]>);

impl Default for Kinds {
    fn default() -> Self {
        Kinds(Arc::from(WorkloadKind::BUILT_IN.as_slice()))
    }
}

impl Kinds {
    /// The built-in kinds alone.
    pub fn built_in() -> Kinds {
        Kinds::default()
    }

    /// The built-in kinds and `configured`; a group and kind configured twice (even at two
    /// versions or pointers) is refused: a review names a group and kind, and must find one
    /// pointer.
    pub fn with_configured(
        configured: impl IntoIterator<Item = WorkloadKind>,
    ) -> Result<Kinds, KindError> {
        let mut all: Vec<WorkloadKind> = WorkloadKind::BUILT_IN.to_vec();
        for kind in configured {
            if all
                .iter()
                .any(|k| k.group() == kind.group() && k.kind() == kind.kind())
            {
                if all.contains(&kind) && !kind.is_built_in() {
                    // The same flag value twice: harmless, kept once.
                    continue;
                }
                return Err(KindError::Twice(
                    kind.group().to_owned(),
                    kind.kind().to_owned(),
                ));
            }
            all.push(kind);
        }
        Ok(Kinds(Arc::from(all)))
    }

    /// Every kind, built-in kinds first.
    pub fn iter(&self) -> impl Iterator<Item = WorkloadKind> + '_ {
        self.0.iter().copied()
    }

    /// The configured kinds alone.
    pub fn configured(&self) -> impl Iterator<Item = WorkloadKind> + '_ {
        self.iter().filter(|k| !k.is_built_in())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, kind: WorkloadKind) -> bool {
        self.0.contains(&kind)
    }

    /// The kind of an API group and kind (`apps`, `Deployment`), at any version.
    pub fn find(&self, group: &str, kind: &str) -> Option<WorkloadKind> {
        self.iter().find(|k| k.group() == group && k.kind() == kind)
    }

    /// The kind of an `apiVersion` and `kind` pair as manifests spell them.
    pub fn from_type(&self, api_version: &str, kind: &str) -> Option<WorkloadKind> {
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        self.find(group, kind)
    }
}

/// How many kinds were configured in this process so far: what was built from [`every_kind`]
/// is current while this is unchanged.
pub fn configured_count() -> usize {
    CONFIGURED_COUNT.load(Ordering::Acquire)
}

/// Every kind configured in this process, built-in kinds first: for what serves all instances
/// (the answer checks of the API client).
pub fn every_kind() -> Vec<WorkloadKind> {
    let configured = CONFIGURED.lock().unwrap_or_else(|e| e.into_inner());
    WorkloadKind::BUILT_IN
        .into_iter()
        .chain(configured.iter().map(|s| WorkloadKind(s)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_value_names_a_kind_and_its_pointer() {
        let kind = WorkloadKind::parse("apps.kruise.io/v1alpha1/CloneSet=/spec/template").unwrap();
        assert_eq!(kind.group(), "apps.kruise.io");
        assert_eq!(kind.version(), "v1alpha1");
        assert_eq!(kind.kind(), "CloneSet");
        assert_eq!(kind.template_path(), ["spec", "template"]);
        assert!(!kind.is_built_in());
        assert_eq!(
            kind.flag(),
            "apps.kruise.io/v1alpha1/CloneSet=/spec/template"
        );
        let job =
            WorkloadKind::parse("keda.sh/v1alpha1/ScaledJob=/spec/jobTargetRef/template").unwrap();
        assert_eq!(job.template_path(), ["spec", "jobTargetRef", "template"]);
        assert_ne!(kind, job);
    }

    #[test]
    fn the_same_flag_value_gives_the_same_kind() {
        let a = WorkloadKind::parse("example.com/v1/Thing=/spec/template").unwrap();
        let b = WorkloadKind::parse("example.com/v1/Thing=/spec/template").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.cmp(&b), std::cmp::Ordering::Equal);
        let other = WorkloadKind::parse("example.com/v1/Thing=/spec/pod").unwrap();
        assert_ne!(a, other);
        assert!(
            a > WorkloadKind::ROLLOUT,
            "configured kinds sort after built-in ones"
        );
    }

    #[test]
    fn kinds_whose_template_cannot_be_stamped_are_refused_with_why() {
        for (value, kind) in [
            ("batch/v1/Job=/spec/template", "Job"),
            ("apps/v1/ReplicaSet=/spec/template", "ReplicaSet"),
            ("/v1/Pod=/spec", "Pod"),
            ("core/v1/Pod=/spec", "Pod"),
        ] {
            let error = WorkloadKind::parse(value).unwrap_err();
            assert!(
                matches!(error, KindError::Refused(k, _) if k == kind),
                "{value}: {error:?}"
            );
        }
        let job = WorkloadKind::parse("batch/v1/Job=/spec/template").unwrap_err();
        assert!(job.to_string().contains("immutable"), "{job}");
        // A key that is a word made of digits and letters is not an index.
        assert!(WorkloadKind::parse("example.com/v1/Pool=/spec/v2template").is_ok());
    }

    #[test]
    fn escaped_pointer_keys_are_unescaped_and_written_back() {
        let kind = WorkloadKind::parse("example.com/v1/Odd=/spec/a~1b/c~0d").unwrap();
        assert_eq!(kind.template_path(), ["spec", "a/b", "c~d"]);
        assert_eq!(kind.template_pointer(), "/spec/a~1b/c~0d");
    }

    #[test]
    fn malformed_values_are_refused_with_what_is_wrong() {
        for (value, error) in [
            ("apps.kruise.io/v1alpha1/CloneSet", KindError::Form),
            ("v1alpha1/CloneSet=/spec/template", KindError::Form),
            ("a/b/c/D=/spec", KindError::Form),
            ("Apps.io/v1/CloneSet=/spec/template", KindError::Group),
            ("/v1/CloneSet=/spec/template", KindError::Group),
            ("apps.io/v1.0/CloneSet=/spec/template", KindError::Version),
            ("apps.io/v1/Clone-Set=/spec/template", KindError::Kind),
            ("apps.io/v1/1Set=/spec/template", KindError::Kind),
            ("apps.io/v1/CloneSet=spec/template", KindError::Pointer),
            ("apps.io/v1/CloneSet=", KindError::Pointer),
            ("apps.io/v1/CloneSet=/", KindError::Pointer),
            ("apps.io/v1/CloneSet=/spec//template", KindError::Pointer),
            ("apps.io/v1/CloneSet=/spec/~2", KindError::Pointer),
            ("apps.io/v1/CloneSet=/spec/\ntemplate", KindError::Pointer),
            (
                "apps.io/v1/CloneSet=/a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q",
                KindError::Pointer,
            ),
            (
                "apps/v1/Deployment=/spec/template",
                KindError::BuiltIn(WorkloadKind::DEPLOYMENT),
            ),
            (
                "example.com/v1/Pool=/spec/templates/0",
                KindError::ArrayIndex,
            ),
            (
                "example.com/v1/Pool=/spec/templates/-",
                KindError::ArrayIndex,
            ),
        ] {
            assert_eq!(WorkloadKind::parse(value), Err(error), "{value:?}");
        }
    }

    #[test]
    fn an_instance_handles_built_in_and_its_configured_kinds() {
        let clone_set =
            WorkloadKind::parse("apps.kruise.io/v1alpha1/CloneSet=/spec/template").unwrap();
        let kinds = Kinds::with_configured([clone_set, clone_set]).unwrap();
        assert_eq!(kinds.len(), 6);
        assert_eq!(kinds.find("apps.kruise.io", "CloneSet"), Some(clone_set));
        assert_eq!(
            kinds.from_type("apps/v1", "StatefulSet"),
            Some(WorkloadKind::STATEFUL_SET)
        );
        assert_eq!(kinds.configured().collect::<Vec<_>>(), [clone_set]);
        assert_eq!(Kinds::built_in().find("apps.kruise.io", "CloneSet"), None);

        let elsewhere =
            WorkloadKind::parse("apps.kruise.io/v1beta1/CloneSet=/spec/template").unwrap();
        assert_eq!(
            Kinds::with_configured([clone_set, elsewhere]),
            Err(KindError::Twice("apps.kruise.io".into(), "CloneSet".into()))
        );
    }

    #[test]
    fn built_in_kinds_match_as_constants() {
        let label = |k: WorkloadKind| match k {
            WorkloadKind::CRON_JOB => "cron",
            WorkloadKind::DEPLOYMENT => "deploy",
            _ => "other",
        };
        assert_eq!(
            label(WorkloadKind::built_in("batch", "CronJob").unwrap()),
            "cron"
        );
        assert_eq!(
            label(WorkloadKind::built_in("apps", "Deployment").unwrap()),
            "deploy"
        );
        assert_eq!(label(WorkloadKind::ROLLOUT), "other");
    }
}
