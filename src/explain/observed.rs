//! What the API shows of a workload and its references besides the stamp: the field managers of
//! a referenced object, the Events confighash recorded about the workload, and the rollout's
//! state from its status. Pure.

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;

use crate::core::names::FIELD_MANAGER;
use crate::core::workload::WorkloadKind;

/// The Events shown, newest last.
pub const MAX_EVENTS: usize = 5;
/// The reasons of the Events confighash records on workloads.
pub const EVENT_REASONS: [&str; 9] = [
    crate::core::names::CONFIG_CHANGED_REASON,
    crate::core::names::TOUCH_FAILED_REASON,
    crate::core::names::TOO_MANY_REFERENCES_REASON,
    crate::core::names::REFERENCES_TOO_LARGE_REASON,
    crate::core::names::CONFIG_FLAPPING_REASON,
    crate::core::names::WOULD_ROLL_REASON,
    crate::core::names::ROLLOUT_COMPLETE_REASON,
    crate::core::names::ROLLOUT_STALLED_REASON,
    crate::core::names::WAVE_HALTED_REASON,
];

/// One entry of `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldManager {
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: Option<String>,
    /// The subresource written (`status`, ...), if not the object itself.
    pub subresource: Option<String>,
    /// When the manager last wrote a field it owns (not necessarily the data), RFC 3339.
    pub last_write: Option<String>,
}

/// One Event confighash recorded about the workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventInfo {
    /// When it was last seen, RFC 3339.
    pub time: Option<String>,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub reason: String,
    pub note: Option<String>,
    /// How many times it was seen, when it repeated.
    pub count: Option<i32>,
}

/// The rollout's state as its status shows it; fields the kind does not have are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutInfo {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Desired replicas (Deployment, StatefulSet, Rollout) or scheduled pods (DaemonSet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desired: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available: Option<i64>,
    /// The `Progressing` condition: status and reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progressing: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// `spec.updateStrategy.type` (StatefulSet, DaemonSet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<String>,
    /// CronJob: `status.lastScheduleTime`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suspended: Option<bool>,
    /// Rollout: `status.phase`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

/// The field managers of an object's `metadata.managedFields`, latest write first.
pub fn field_managers(entries: Option<&[ManagedFieldsEntry]>) -> Vec<FieldManager> {
    let mut managers: Vec<FieldManager> = entries
        .unwrap_or_default()
        .iter()
        .map(|e| FieldManager {
            manager: e.manager.clone().unwrap_or_else(|| "(unnamed)".to_owned()),
            operation: e.operation.clone(),
            subresource: e.subresource.clone().filter(|s| !s.is_empty()),
            last_write: e.time.as_ref().map(|t| time(&t.0)),
        })
        .collect();
    // RFC 3339 in UTC with whole seconds sorts as text.
    managers.sort_by(|a, b| b.last_write.cmp(&a.last_write));
    managers
}

/// A time as RFC 3339 in UTC, to the second.
pub fn time(t: &Timestamp) -> String {
    format!("{t:.0}")
}

/// The last [`MAX_EVENTS`] Events confighash recorded about the workload, newest last.
pub fn recorded_events(
    events: &[Event],
    kind: WorkloadKind,
    namespace: &str,
    name: &str,
) -> Vec<EventInfo> {
    let mut found: Vec<(Option<Timestamp>, EventInfo)> = events
        .iter()
        .filter(|e| {
            let about = e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some(kind.kind())
                    && r.name.as_deref() == Some(name)
                    && r.namespace.as_deref().is_none_or(|ns| ns == namespace)
            });
            about
                && e.reporting_controller.as_deref() == Some(FIELD_MANAGER)
                && e.reason
                    .as_deref()
                    .is_some_and(|r| EVENT_REASONS.contains(&r))
        })
        .map(|e| {
            let when = e
                .series
                .as_ref()
                .map(|s| s.last_observed_time.0)
                .or(e.event_time.as_ref().map(|t| t.0))
                .or(e.deprecated_last_timestamp.as_ref().map(|t| t.0))
                .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0));
            let info = EventInfo {
                time: when.as_ref().map(time),
                type_: e.type_.clone(),
                reason: e.reason.clone().unwrap_or_default(),
                note: e.note.clone(),
                count: e
                    .series
                    .as_ref()
                    .map(|s| s.count)
                    .or(e.deprecated_count)
                    .filter(|c| *c > 1),
            };
            (when, info)
        })
        .collect();
    found.sort_by_key(|a| a.0);
    let skip = found.len().saturating_sub(MAX_EVENTS);
    found.into_iter().skip(skip).map(|(_, e)| e).collect()
}

/// The note of the newest `WaveHalted` Event confighash recorded on a ConfigMap or Secret for
/// the content of resourceVersion `resource_version` (its note names it), if any.
pub fn wave_halted(
    events: &[Event],
    kind: &str,
    namespace: &str,
    name: &str,
    resource_version: &str,
) -> Option<String> {
    let names = format!("(resourceVersion {resource_version})");
    events
        .iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some(kind)
                    && r.name.as_deref() == Some(name)
                    && r.namespace.as_deref().is_none_or(|ns| ns == namespace)
            }) && e.reporting_controller.as_deref() == Some(FIELD_MANAGER)
                && e.reason.as_deref() == Some(crate::core::names::WAVE_HALTED_REASON)
                && e.note.as_deref().is_some_and(|n| n.contains(&names))
        })
        .max_by_key(|e| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .and_then(|e| e.note.clone())
}

/// The rollout's state from the workload's status.
pub fn rollout(kind: WorkloadKind, obj: &Value) -> RolloutInfo {
    let int = |p: &str| obj.pointer(p).and_then(Value::as_i64);
    let text = |p: &str| obj.pointer(p).and_then(Value::as_str).map(str::to_owned);
    let flag = |p: &str| obj.pointer(p).and_then(Value::as_bool);
    let progressing = || {
        obj.pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("Progressing"))
            .map(|c| {
                let status = c.get("status").and_then(Value::as_str).unwrap_or("Unknown");
                match c.get("reason").and_then(Value::as_str) {
                    Some(reason) => format!("{status} ({reason})"),
                    None => status.to_owned(),
                }
            })
    };
    let generation = int("/metadata/generation");
    let observed_generation = int("/status/observedGeneration");
    match kind {
        WorkloadKind::DEPLOYMENT | WorkloadKind::ROLLOUT => RolloutInfo {
            generation,
            observed_generation,
            desired: Some(int("/spec/replicas").unwrap_or(1)),
            updated: int("/status/updatedReplicas"),
            ready: int("/status/readyReplicas"),
            available: int("/status/availableReplicas"),
            progressing: progressing(),
            paused: flag("/spec/paused"),
            phase: (kind == WorkloadKind::ROLLOUT)
                .then(|| text("/status/phase"))
                .flatten(),
            ..RolloutInfo::default()
        },
        WorkloadKind::STATEFUL_SET => RolloutInfo {
            generation,
            observed_generation,
            desired: Some(int("/spec/replicas").unwrap_or(1)),
            updated: int("/status/updatedReplicas"),
            ready: int("/status/readyReplicas"),
            available: int("/status/availableReplicas"),
            update_strategy: text("/spec/updateStrategy/type"),
            ..RolloutInfo::default()
        },
        WorkloadKind::DAEMON_SET => RolloutInfo {
            generation,
            observed_generation,
            desired: int("/status/desiredNumberScheduled"),
            updated: int("/status/updatedNumberScheduled"),
            ready: int("/status/numberReady"),
            available: int("/status/numberAvailable"),
            update_strategy: text("/spec/updateStrategy/type"),
            ..RolloutInfo::default()
        },
        WorkloadKind::CRON_JOB => RolloutInfo {
            last_schedule_time: text("/status/lastScheduleTime"),
            last_successful_time: text("/status/lastSuccessfulTime"),
            suspended: Some(flag("/spec/suspend").unwrap_or(false)),
            ..RolloutInfo::default()
        },
        // A configured kind: its status is its CRD's own; what is common is shown.
        _ => RolloutInfo {
            generation,
            observed_generation,
            ..RolloutInfo::default()
        },
    }
}
