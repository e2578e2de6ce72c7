//! Who is calling: the stand-in's authentication.
//!
//! Mimics kube-apiserver's token authentication: a bearer token maps to a user; requests without
//! a token are the superuser (as a cluster-admin kubeconfig is), so tests that do not care about
//! RBAC need no setup.

/// The authenticated user of a request, as an AdmissionReview's `userInfo` and RBAC see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The user a ServiceAccount's token authenticates as, with the groups Kubernetes gives it.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        UserInfo {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_owned(),
            ],
        }
    }

    /// The superuser (`system:masters`), which RBAC never restricts.
    pub fn admin() -> Self {
        UserInfo {
            username: "kubernetes-admin".to_owned(),
            groups: vec![
                "system:masters".to_owned(),
                "system:authenticated".to_owned(),
            ],
        }
    }

    pub fn is_superuser(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}
