//! What a client may tell the producer about its request: in the body under `"burst_prefix"` (a
//! name no inference server reads) or in `x-burst-prefix-*` headers, which every front-end reads
//! through [`Hints::from_headers`] or [`Hints::from_header_values`].

use std::num::NonZeroU32;

use serde::Deserialize;

use super::request::error::RequestError;

/// The header that carries the group-size hint.
pub const GROUP_SIZE_HEADER: &str = "x-burst-prefix-group-size";
/// The header that names the model weights a request was made for (RL rollouts): a new version
/// makes the producer forget what the replicas cached under the older one.
pub const WEIGHT_VERSION_HEADER: &str = "x-burst-prefix-weight-version";

/// The longest weight version accepted.
const MAX_WEIGHT_VERSION: usize = 256;

/// The key of [`Hints`] in a request body.
pub const HINTS_FIELD: &str = "burst_prefix";

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hints {
    /// How many requests (this one included) share this exact prompt; a window whose hinted
    /// groups are all complete is sealed at once.
    pub group_size: Option<NonZeroU32>,
    /// The model weights the request was made for (any text, e.g. a training step).
    pub weight_version: Option<String>,
}

impl Hints {
    /// The hints of an HTTP request's headers (a bad value is an error naming the header).
    pub fn from_headers(headers: &http::HeaderMap) -> Result<Hints, RequestError> {
        Self::from_header_values(|name| headers.get(name).map(|value| value.as_bytes()))
    }

    /// The hints of headers read by `value(name)` (lowercase names), for protocols that carry
    /// headers their own way (ext_proc).
    pub fn from_header_values<'a>(
        value: impl Fn(&str) -> Option<&'a [u8]>,
    ) -> Result<Hints, RequestError> {
        let group_size = value(GROUP_SIZE_HEADER)
            .map(|raw| {
                std::str::from_utf8(raw)
                    .ok()
                    .and_then(|text| text.trim().parse().ok())
                    .ok_or_else(|| RequestError::Field {
                        field: format!("header {GROUP_SIZE_HEADER}"),
                        problem: format!(
                            "expected an integer >= 1, got {:?}",
                            String::from_utf8_lossy(raw)
                        ),
                    })
            })
            .transpose()?;
        let weight_version = value(WEIGHT_VERSION_HEADER)
            .map(|raw| {
                std::str::from_utf8(raw)
                    .ok()
                    .map(str::trim)
                    .filter(|text| !text.is_empty() && text.len() <= MAX_WEIGHT_VERSION)
                    .map(str::to_string)
                    .ok_or_else(|| RequestError::Field {
                        field: format!("header {WEIGHT_VERSION_HEADER}"),
                        problem: format!(
                            "expected text of 1 to {MAX_WEIGHT_VERSION} bytes, got {:?}",
                            String::from_utf8_lossy(raw)
                        ),
                    })
            })
            .transpose()?;
        Ok(Hints {
            group_size,
            weight_version,
        })
    }

    /// These hints, completed by `fallback` where unset (headers win over the body).
    pub fn or(self, fallback: Hints) -> Hints {
        Hints {
            group_size: self.group_size.or(fallback.group_size),
            weight_version: self.weight_version.or(fallback.weight_version),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(value: Option<&'static str>) -> Result<Hints, RequestError> {
        Hints::from_header_values(|name| {
            value
                .filter(|_| name == GROUP_SIZE_HEADER)
                .map(str::as_bytes)
        })
    }

    #[test]
    fn a_group_size_header_is_a_positive_integer_or_an_error_naming_it() {
        assert_eq!(from(None).unwrap(), Hints::default());
        assert_eq!(from(Some(" 8 ")).unwrap().group_size, NonZeroU32::new(8));
        for bad in ["0", "-1", "x", ""] {
            let error = from(Some(bad)).unwrap_err();
            assert_eq!(error.field(), "header x-burst-prefix-group-size", "{bad}");
            assert!(error.to_string().contains(&format!("{bad:?}")), "{error}");
        }
    }

    #[test]
    fn headers_win_over_the_body() {
        let header = Hints {
            group_size: NonZeroU32::new(4),
            weight_version: Some("step-2".into()),
        };
        let body = Hints {
            group_size: NonZeroU32::new(8),
            weight_version: Some("step-1".into()),
        };
        assert_eq!(header.clone().or(body.clone()), header);
        assert_eq!(Hints::default().or(body.clone()), body);
    }

    #[test]
    fn a_weight_version_header_is_short_text() {
        let read = |value: &'static [u8]| {
            Hints::from_header_values(|name| (name == WEIGHT_VERSION_HEADER).then_some(value))
        };
        assert_eq!(read(b" 7 ").unwrap().weight_version.as_deref(), Some("7"));
        let error = read(b"").unwrap_err();
        assert_eq!(error.field(), "header x-burst-prefix-weight-version");
        assert!(read(&[b'x'; 300]).is_err());
    }
}
