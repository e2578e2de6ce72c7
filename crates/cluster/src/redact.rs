//! Error text that is safe to log: it says what went wrong and where, never what was read.
//!
//! serde's messages quote the unexpected value (`invalid type: string "…"`), and the API
//! server's Status messages can quote the object a request carried, so neither is logged as it
//! is. Every error from reading ConfigMaps, Secrets or reviews goes through here before it
//! reaches a log line or an answer.

use std::fmt::Write;

pub use confighash_core::json::error_text as json_error;

/// A Kubernetes client error without anything the API server sent but its status code and a
/// reason Kubernetes defines.
pub fn kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            let mut text = format!("the API server answered {}", status.code);
            if is_known_reason(&status.reason) {
                let _ = write!(text, " {}", status.reason);
            }
            text
        }
        kube::Error::SerdeError(e) => format!("decoding the answer: {}", json_error(e)),
        kube::Error::FromUtf8(_) => "the answer is not UTF-8".to_owned(),
        kube::Error::ReadEvents(e) => format!("reading the watch stream: {}", e.kind()),
        kube::Error::LinesCodecMaxLineLengthExceeded => "a watch event is too long".to_owned(),
        // Discovery errors can quote a group version the API server named.
        kube::Error::Discovery(e) => format!("discovery: {}", discovery_error(e)),
        // Transport, TLS, authentication and configuration errors: none carries a response body.
        other => other.to_string(),
    }
}

fn discovery_error(e: &kube::error::DiscoveryError) -> &'static str {
    use kube::error::DiscoveryError;
    match e {
        DiscoveryError::InvalidGroupVersion(_) => "the API server named an invalid group version",
        DiscoveryError::MissingKind(_) => "the kind is not served",
        DiscoveryError::MissingApiGroup(_) => "the API group is not served",
        DiscoveryError::MissingResource(_) => "the resource is not served",
        DiscoveryError::EmptyApiGroup(_) => "the API group serves no version",
    }
}

/// A watch error, as [`kube_error`].
pub fn watcher_error(e: &kube::runtime::watcher::Error) -> String {
    use kube::runtime::watcher::Error;
    match e {
        Error::InitialListFailed(e) => format!("listing failed: {}", kube_error(e)),
        Error::WatchStartFailed(e) => format!("starting the watch failed: {}", kube_error(e)),
        Error::WatchError(status) => {
            let mut text = format!("the watch ended with {}", status.code);
            if is_known_reason(&status.reason) {
                let _ = write!(text, " {}", status.reason);
            }
            text
        }
        Error::WatchFailed(e) => format!("the watch failed: {}", kube_error(e)),
        Error::NoResourceVersion => "the list carried no resourceVersion".to_owned(),
    }
}

/// Whether a watch error is the API server's 403: the caller may not list or watch there.
pub fn is_forbidden(e: &kube::runtime::watcher::Error) -> bool {
    use kube::runtime::watcher::Error;
    match e {
        Error::InitialListFailed(e) | Error::WatchStartFailed(e) | Error::WatchFailed(e) => {
            matches!(e, kube::Error::Api(status) if status.code == 403)
        }
        Error::WatchError(status) => status.code == 403,
        Error::NoResourceVersion => false,
    }
}

/// A reason Kubernetes defines, such as `NotFound` or `Expired`: never free text (a server could
/// put a value that is a plain word there).
fn is_known_reason(s: &str) -> bool {
    kube::core::response::reason::is_known(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_errors_name_the_place_not_the_value() {
        let e =
            serde_json::from_str::<std::collections::BTreeMap<String, u8>>(r#"{"k":"hunter2"}"#)
                .unwrap_err();
        assert!(e.to_string().contains("hunter2"), "serde quotes it: {e}");
        let safe = json_error(&e);
        assert!(!safe.contains("hunter2"), "{safe}");
        assert!(safe.contains("line 1"), "{safe}");
    }

    #[test]
    fn api_errors_keep_the_code_and_a_reason_word_only() {
        let status =
            kube::core::Status::failure("secret hunter2 is invalid", "Invalid").with_code(422);
        let safe = kube_error(&kube::Error::Api(status.boxed()));
        assert_eq!(safe, "the API server answered 422 Invalid");
        for reason in ["hunter 2", "Hunter"] {
            let status = kube::core::Status::failure("x", reason).with_code(500);
            let safe = kube_error(&kube::Error::Api(status.boxed()));
            assert_eq!(safe, "the API server answered 500");
        }
    }
}
