//! What the elasticsearch source and sink share: the cluster's base URL and
//! how credentials become the `Authorization` header.

#[cfg(feature = "elasticsearch-sink")]
pub mod sink;
#[cfg(feature = "elasticsearch-source")]
pub mod source;

use secrecy::{ExposeSecret, SecretString};

use crate::connectors::PluginConfigError;
use crate::connectors::kit::http::Auth;

pub use crate::connectors::kit::http::base_url;

/// `ApiKey` when a key is set, else basic auth when both halves are, naming
/// the missing half when only one is.
pub fn auth(
    api_key: Option<&SecretString>,
    username: Option<&String>,
    password: Option<&SecretString>,
) -> Result<Auth, PluginConfigError> {
    match (api_key, username, password) {
        (Some(key), _, _) => Ok(Auth::Header {
            name: "authorization".into(),
            value: format!("ApiKey {}", key.expose_secret()).into(),
        }),
        (None, Some(username), Some(password)) => Ok(Auth::Basic {
            username: username.clone(),
            password: password.clone(),
        }),
        (None, None, None) => Ok(Auth::None),
        (None, None, Some(_)) => Err(PluginConfigError::new(
            "username",
            "username and password go together (basic auth)",
        )),
        (None, Some(_), None) => Err(PluginConfigError::new(
            "password",
            "username and password go together (basic auth)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_url_with_a_path_when_parsed_should_join_under_it() {
        let url = base_url("https://h:9243/es?x=1").unwrap();
        assert_eq!(
            url.join("_bulk").unwrap().as_str(),
            "https://h:9243/es/_bulk"
        );
        assert_eq!(base_url("ftp://h").unwrap_err().field, "url");
    }

    #[test]
    fn given_half_of_basic_auth_when_built_should_name_the_missing_half() {
        let user = "u".to_owned();
        assert_eq!(auth(None, Some(&user), None).unwrap_err().field, "password");
        let password = SecretString::from("p");
        assert_eq!(
            auth(None, None, Some(&password)).unwrap_err().field,
            "username"
        );
        let key = SecretString::from("k");
        assert!(matches!(
            auth(Some(&key), Some(&user), Some(&password)).unwrap(),
            Auth::Header { .. }
        ));
    }
}
