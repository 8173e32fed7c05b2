//! What a client may tell the producer about its request: in the body under `"burst_prefix"` (a
//! name no inference server reads) or in `x-burst-prefix-*` headers, which every front-end reads
//! through [`Hints::from_headers`] or [`Hints::from_header_values`].

use std::num::NonZeroU32;

use serde::Deserialize;

use super::request::error::RequestError;

/// The header that carries the group-size hint.
pub const GROUP_SIZE_HEADER: &str = "x-burst-prefix-group-size";

/// The key of [`Hints`] in a request body.
pub const HINTS_FIELD: &str = "burst_prefix";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hints {
    /// How many requests (this one included) share this exact prompt; a window whose hinted
    /// groups are all complete is sealed at once.
    pub group_size: Option<NonZeroU32>,
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
        let Some(raw) = value(GROUP_SIZE_HEADER) else {
            return Ok(Hints::default());
        };
        let group_size = std::str::from_utf8(raw)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .ok_or_else(|| RequestError::Field {
                field: format!("header {GROUP_SIZE_HEADER}"),
                problem: format!(
                    "expected an integer >= 1, got {:?}",
                    String::from_utf8_lossy(raw)
                ),
            })?;
        Ok(Hints {
            group_size: Some(group_size),
        })
    }

    /// These hints, completed by `fallback` where unset (headers win over the body).
    pub fn or(self, fallback: Hints) -> Hints {
        Hints {
            group_size: self.group_size.or(fallback.group_size),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(value: Option<&'static str>) -> Result<Hints, RequestError> {
        Hints::from_header_values(|name| {
            assert_eq!(name, GROUP_SIZE_HEADER);
            value.map(str::as_bytes)
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
        };
        let body = Hints {
            group_size: NonZeroU32::new(8),
        };
        assert_eq!(header.or(body), header);
        assert_eq!(Hints::default().or(body), body);
    }
}
