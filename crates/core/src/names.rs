//! The contract's names: what users write in their manifests and what confighash writes in the
//! cluster. Promises to users: never rename one.

/// Namespace label that opts a namespace in (value `true`); on a workload, value `false` opts
/// that workload out of a namespace that is opted in, and value `true` opts that workload in
/// wherever it is (but in an excluded namespace).
pub const ENABLED_LABEL: &str = "confighash.dev/enabled";
/// The stamped annotation on the pod template.
pub const CHECKSUM_ANNOTATION: &str = "confighash.dev/checksum";
/// Workload metadata annotation marking a CREATE that could not be stamped.
pub const UNSTAMPED_ANNOTATION: &str = "confighash.dev/unstamped";
/// The value of [`UNSTAMPED_ANNOTATION`] after a failed lookup: reconcile retries it.
pub const UNSTAMPED_LOOKUP_FAILED: &str = "lookup-failed";
/// The value of [`UNSTAMPED_ANNOTATION`] when the workload references more objects than
/// `--max-references`: terminal, reconcile leaves it.
pub const UNSTAMPED_TOO_MANY_REFERENCES: &str = "too-many-references";
/// The value of [`UNSTAMPED_ANNOTATION`] when the workload's references hold more decoded bytes
/// than `--max-reference-bytes`: reconcile retries it (Secrets shrink without a workload write).
pub const UNSTAMPED_TOO_LARGE: &str = "too-large";
/// The annotation that leaves a ConfigMap or Secret out of every checksum (value exactly "true").
pub const IGNORE_ANNOTATION: &str = "confighash.dev/ignore";
/// Workload annotation naming extra ConfigMaps (comma separated) the pod spec does not show.
pub const EXTRA_CONFIGMAPS_ANNOTATION: &str = "confighash.dev/extra-configmaps";
/// Workload annotation naming extra Secrets (comma separated) the pod spec does not show.
pub const EXTRA_SECRETS_ANNOTATION: &str = "confighash.dev/extra-secrets";
/// Annotation put on a Secret confighash creates, saying what it is.
pub const DESCRIPTION_ANNOTATION: &str = "confighash.dev/description";
/// Field manager of every write confighash makes.
pub const FIELD_MANAGER: &str = "confighash";
/// The pod-template annotation `kubectl rollout restart` sets (not confighash's: read only).
pub const RESTARTED_AT_ANNOTATION: &str = "kubectl.kubernetes.io/restartedAt";
/// Label put on a Secret confighash creates.
pub const NAME_LABEL: (&str, &str) = ("app.kubernetes.io/name", "confighash");
/// The namespace whose objects confighash never reads or touches, whatever a review says.
pub const KUBE_SYSTEM: &str = "kube-system";
/// The default of `--max-references`: the most distinct ConfigMaps and Secrets one workload may
/// reference before it is left unstamped (`too-many-references`).
pub const DEFAULT_MAX_REFERENCES: usize = 256;

/// The default of `--max-reference-bytes`: the decoded bytes the recipe may read for one
/// workload (16 MiB) before it is left unstamped (`too-large`).
pub const DEFAULT_MAX_REFERENCE_BYTES: u64 = 16 << 20;

// The reasons of the Events confighash records on workloads (the contract's Events table).
/// The reason of the Warning Event on a workload over `--max-references`.
pub const TOO_MANY_REFERENCES_REASON: &str = "TooManyReferences";
/// The reason of the Warning Event on a workload whose references hold more than
/// `--max-reference-bytes`, once each time it goes over.
pub const REFERENCES_TOO_LARGE_REASON: &str = "ReferencesTooLarge";
/// The reason of the Event on a workload whose pod template was re-stamped.
pub const CONFIG_CHANGED_REASON: &str = "ConfigChanged";
/// The reason of the Warning Event on a workload whose touch keeps failing.
pub const TOUCH_FAILED_REASON: &str = "TouchFailed";
/// The reason of the Warning Event on the dependents of a ConfigMap or Secret that flaps, once
/// per episode.
pub const CONFIG_FLAPPING_REASON: &str = "ConfigFlapping";
/// The reason of the Normal Event a dry run (`--dry-run`) records instead of a touch.
pub const WOULD_ROLL_REASON: &str = "WouldRoll";
/// The reason of the Event on a workload whose rollout after a config change completed.
pub const ROLLOUT_COMPLETE_REASON: &str = "RolloutComplete";
/// The reason of the Warning Event on a workload whose rollout after a config change stalled.
pub const ROLLOUT_STALLED_REASON: &str = "RolloutStalled";
/// On a ConfigMap or Secret, with [`PROGRESSIVE`] as its value: a content change rolls its
/// dependents in progressive waves (batches of 1, 2, 4, ... each after the one before finished
/// healthy).
pub const ROLLOUT_ANNOTATION: &str = "confighash.dev/rollout";
/// The value of [`ROLLOUT_ANNOTATION`] that turns progressive waves on (exactly this).
pub const PROGRESSIVE: &str = "progressive";
/// The Warning Event on a config object and a workload when a progressive wave halts.
pub const WAVE_HALTED_REASON: &str = "WaveHalted";
