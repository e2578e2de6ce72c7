//! One record per referenced object: what the recipe needs of an existing ConfigMap or Secret,
//! its per-key digests or that it is ignored. The webhook's lookups, the watcher's store (which
//! adds the resourceVersion), offline stamping (which adds the object's place in its input) and
//! `explain` all keep this, and all show it to the rules through [`state_of`].

use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use crate::checksum::{self, ObjectDigest, ObjectView, RecipeError, RefState};

/// What the recipe needs of one existing object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRecord {
    /// Annotated `confighash.dev/ignore: "true"`: left out of every checksum (its digests are
    /// not kept).
    pub ignored: bool,
    pub digest: ObjectDigest,
}

impl ObjectRecord {
    /// The record of a ConfigMap: `data` (UTF-8) and `binaryData` (decoded).
    pub fn config_map(cm: &ConfigMap) -> Result<Self, RecipeError> {
        if checksum::is_ignored(cm.metadata.annotations.as_ref()) {
            return Ok(ObjectRecord::ignored());
        }
        Ok(ObjectRecord {
            ignored: false,
            digest: ObjectDigest::from_view(&ObjectView::config_map(cm)?),
        })
    }

    /// The record of a Secret: `data` (decoded), with `stringData` merged over it.
    pub fn secret(secret: &Secret) -> Self {
        if checksum::is_ignored(secret.metadata.annotations.as_ref()) {
            return ObjectRecord::ignored();
        }
        ObjectRecord {
            ignored: false,
            digest: ObjectDigest::from_view(&ObjectView::secret(secret)),
        }
    }

    /// The record of an ignored object.
    pub fn ignored() -> Self {
        ObjectRecord {
            ignored: true,
            digest: ObjectDigest::default(),
        }
    }
}

/// What the recipe sees of an object from its record: absent without one, ignored, or its
/// entries. Every `rules::View` of records answers through this.
pub fn state_of(record: Option<&ObjectRecord>) -> RefState<'_> {
    match record {
        None => RefState::Absent,
        Some(r) if r.ignored => RefState::Ignored,
        Some(r) => RefState::Present(&r.digest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_ignored_object_keeps_no_digests_and_reads_as_ignored() {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "a", "annotations": {crate::names::IGNORE_ANNOTATION: "true"}},
            "data": {"k": "v"},
        }))
        .unwrap();
        let record = ObjectRecord::config_map(&cm).unwrap();
        assert_eq!(record, ObjectRecord::ignored());
        assert!(matches!(state_of(Some(&record)), RefState::Ignored));
        assert!(matches!(state_of(None), RefState::Absent));
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "s"}, "data": {"k": "dg=="},
        }))
        .unwrap();
        let record = ObjectRecord::secret(&secret);
        assert!(!record.ignored);
        assert_eq!(record.digest.len(), 1);
        assert!(matches!(state_of(Some(&record)), RefState::Present(_)));
    }
}
