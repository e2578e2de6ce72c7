//! How the lists of the served kinds merge: the `patchStrategy` and `patchMergeKey` tags of the
//! Kubernetes API types, for the fields a strategic merge patch or the field manager has to know.
//!
//! Only the types the stand-in serves are described, and of those the fields that hold lists or
//! lead to them. A list field that is not described here is not guessed at: the strategic merge
//! patch refuses it (see `patches::strategic`) and the field manager treats it as one atomic
//! value (see `managed`).

/// A type of the Kubernetes API, as far as the merge rules of its lists go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    /// A type this module does not describe: its lists are unknown.
    Unknown,
    /// A type under which every list is atomic (no `patchStrategy`): it is replaced whole.
    Atomic,
    /// `status`: `conditions` merge by `type`; its other lists are atomic.
    Status,
    ObjectMeta,
    NamespaceRoot,
    ConfigMapRoot,
    SecretRoot,
    EventRoot,
    LeaseRoot,
    WebhookConfigurationRoot,
    MutatingWebhook,
    DeploymentRoot,
    StatefulSetRoot,
    DaemonSetRoot,
    CronJobRoot,
    WorkloadSpec,
    CronJobSpec,
    JobTemplateSpec,
    JobSpec,
    PodTemplateSpec,
    PodSpec,
    Container,
}

/// How a list field merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// `patchStrategy: merge` with `patchMergeKey`: items are matched by that key; the items'
    /// type is the second field.
    Merge(&'static str, Ty),
    /// `patchStrategy: merge` on a list of scalars (`finalizers`): a set union.
    Set,
    /// No `patchStrategy`: the list is replaced whole.
    Atomic,
}

/// What a field of a type holds, as far as merging goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// A map or struct of this type (or a scalar: its type does not matter then).
    Object(Ty),
    /// A list that merges so.
    List(ListKind),
    /// Not described: a list here is unknown.
    Unknown,
}

/// The type of an object of `kind` in `group`; None for custom resources, which have no
/// `patchStrategy` tags (kube-apiserver refuses strategic merge patches for them).
pub fn root(group: &str, kind: &str) -> Option<Ty> {
    Some(match (group, kind) {
        ("", "Namespace") => Ty::NamespaceRoot,
        ("", "ConfigMap") => Ty::ConfigMapRoot,
        ("", "Secret") => Ty::SecretRoot,
        ("" | "events.k8s.io", "Event") => Ty::EventRoot,
        ("coordination.k8s.io", "Lease") => Ty::LeaseRoot,
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => {
            Ty::WebhookConfigurationRoot
        }
        ("apps", "Deployment") => Ty::DeploymentRoot,
        ("apps", "StatefulSet") => Ty::StatefulSetRoot,
        ("apps", "DaemonSet") => Ty::DaemonSetRoot,
        ("batch", "CronJob") => Ty::CronJobRoot,
        _ => return None,
    })
}

/// The field `name` of type `ty`. Scalar fields need no description: only maps and lists merge.
pub fn field(ty: Ty, name: &str) -> Field {
    use Field::{List, Object};
    use ListKind::{Atomic, Merge, Set};
    let atomic = Object(Ty::Atomic);
    let root = |name: &str| match name {
        "metadata" => Some(Object(Ty::ObjectMeta)),
        "status" => Some(Object(Ty::Status)),
        _ => None,
    };
    let described = match ty {
        Ty::Unknown => None,
        Ty::Atomic => Some(atomic),
        Ty::Status => Some(match name {
            "conditions" => List(Merge("type", Ty::Atomic)),
            _ => atomic,
        }),
        Ty::ObjectMeta => match name {
            "finalizers" => Some(List(Set)),
            "ownerReferences" => Some(List(Merge("uid", Ty::Atomic))),
            "managedFields" => Some(List(Atomic)),
            "labels" | "annotations" => Some(atomic),
            _ => None,
        },
        // NamespaceSpec's `finalizers` has no patchStrategy; a Lease has no list.
        Ty::NamespaceRoot | Ty::LeaseRoot => root(name).or(match name {
            "spec" => Some(atomic),
            _ => None,
        }),
        Ty::ConfigMapRoot => root(name).or(match name {
            "data" | "binaryData" => Some(atomic),
            _ => None,
        }),
        Ty::SecretRoot => root(name).or(match name {
            "data" | "stringData" => Some(atomic),
            _ => None,
        }),
        // Neither Event version has a list field.
        Ty::EventRoot => root(name).or(Some(atomic)),
        Ty::WebhookConfigurationRoot => root(name).or(match name {
            "webhooks" => Some(List(Merge("name", Ty::MutatingWebhook))),
            _ => None,
        }),
        Ty::MutatingWebhook => match name {
            "matchConditions" => Some(List(Merge("name", Ty::Atomic))),
            "rules" | "admissionReviewVersions" => Some(List(Atomic)),
            "clientConfig" | "namespaceSelector" | "objectSelector" => Some(atomic),
            _ => None,
        },
        Ty::DeploymentRoot | Ty::StatefulSetRoot | Ty::DaemonSetRoot => root(name).or(match name {
            "spec" => Some(Object(Ty::WorkloadSpec)),
            _ => None,
        }),
        Ty::CronJobRoot => root(name).or(match name {
            "spec" => Some(Object(Ty::CronJobSpec)),
            _ => None,
        }),
        // DeploymentSpec, StatefulSetSpec and DaemonSetSpec together.
        Ty::WorkloadSpec => match name {
            "template" => Some(Object(Ty::PodTemplateSpec)),
            "volumeClaimTemplates" => Some(List(Atomic)),
            "selector"
            | "strategy"
            | "updateStrategy"
            | "persistentVolumeClaimRetentionPolicy"
            | "ordinals" => Some(atomic),
            _ => None,
        },
        Ty::CronJobSpec => match name {
            "jobTemplate" => Some(Object(Ty::JobTemplateSpec)),
            _ => None,
        },
        Ty::JobTemplateSpec | Ty::PodTemplateSpec => match name {
            "metadata" => Some(Object(Ty::ObjectMeta)),
            "spec" if ty == Ty::JobTemplateSpec => Some(Object(Ty::JobSpec)),
            "spec" => Some(Object(Ty::PodSpec)),
            _ => None,
        },
        Ty::JobSpec => match name {
            "template" => Some(Object(Ty::PodTemplateSpec)),
            "podFailurePolicy" | "successPolicy" | "selector" => Some(atomic),
            _ => None,
        },
        Ty::PodSpec => match name {
            "containers" | "initContainers" | "ephemeralContainers" => {
                Some(List(Merge("name", Ty::Container)))
            }
            // Volume is `merge,retainKeys`; its own lists (items, sources) are atomic.
            "volumes" | "imagePullSecrets" | "resourceClaims" | "schedulingGates" => {
                Some(List(Merge("name", Ty::Atomic)))
            }
            "hostAliases" => Some(List(Merge("ip", Ty::Atomic))),
            "topologySpreadConstraints" => Some(List(Merge("topologyKey", Ty::Atomic))),
            "tolerations" | "readinessGates" => Some(List(Atomic)),
            "affinity" | "securityContext" | "dnsConfig" | "nodeSelector" | "overhead" | "os"
            | "resources" => Some(atomic),
            _ => None,
        },
        Ty::Container => match name {
            "ports" => Some(List(Merge("containerPort", Ty::Atomic))),
            "env" => Some(List(Merge("name", Ty::Atomic))),
            "volumeMounts" => Some(List(Merge("mountPath", Ty::Atomic))),
            "volumeDevices" => Some(List(Merge("devicePath", Ty::Atomic))),
            "envFrom" | "args" | "command" | "resizePolicy" | "restartPolicyRules" => {
                Some(List(Atomic))
            }
            "resources" | "livenessProbe" | "readinessProbe" | "startupProbe" | "lifecycle"
            | "securityContext" => Some(atomic),
            _ => None,
        },
    };
    described.unwrap_or(Field::Unknown)
}

impl Field {
    /// The merge rule of a list in this field; None when it is not known.
    pub fn list(self) -> Option<ListKind> {
        match self {
            Field::List(kind) => Some(kind),
            // Under an atomic type every list is atomic.
            Field::Object(Ty::Atomic) => Some(ListKind::Atomic),
            Field::Object(_) | Field::Unknown => None,
        }
    }

    /// The type of a map in this field.
    pub fn object(self) -> Ty {
        match self {
            Field::Object(ty) => ty,
            Field::List(_) | Field::Unknown => Ty::Unknown,
        }
    }
}
