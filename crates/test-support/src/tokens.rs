//! Static bearer tokens: kube-apiserver's `--token-auth-file`, read once at start.

use std::io::Read;

/// A user that authenticates with a static bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenUser {
    pub token: String,
    pub name: String,
    pub groups: Vec<String>,
}

impl TokenUser {
    /// A user with a fresh random token.
    pub fn new(name: impl Into<String>, groups: &[&str]) -> Self {
        Self {
            token: random_token(),
            name: name.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    /// A token that authenticates as `system:serviceaccount:<namespace>:<name>` with the groups a
    /// real service-account token has, so RBAC bindings to that ServiceAccount apply to it. The
    /// ServiceAccount object need not exist. (For a real token of an existing ServiceAccount see
    /// [`crate::ControlPlane::service_account_token`].)
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self::new(
            format!("system:serviceaccount:{namespace}:{name}"),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{namespace}"),
            ],
        )
    }

    /// Its line in the token file: `token,user,uid,"group1,group2"`.
    pub(crate) fn csv_line(&self) -> String {
        format!(
            "{},{},{},\"{}\"\n",
            self.token,
            self.name,
            self.name,
            self.groups.join(",")
        )
    }
}

/// 128 random bits, hex encoded.
pub(crate) fn random_token() -> String {
    random_hex(16)
}

pub(crate) fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("reading /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_user_has_the_real_groups() {
        let user = TokenUser::service_account("ns1", "operator");
        assert_eq!(user.name, "system:serviceaccount:ns1:operator");
        assert_eq!(
            user.groups,
            ["system:serviceaccounts", "system:serviceaccounts:ns1"]
        );
        assert_eq!(user.token.len(), 32);
        assert_eq!(
            user.csv_line(),
            format!(
                "{},system:serviceaccount:ns1:operator,system:serviceaccount:ns1:operator,\"system:serviceaccounts,system:serviceaccounts:ns1\"\n",
                user.token
            )
        );
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(random_token(), random_token());
    }
}
