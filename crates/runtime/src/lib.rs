//! What both binaries need once, written once: the log flags and their setup ([`logging`]),
//! Lease leader election ([`leader`]), the admin router with `/healthz`, `/readyz` and
//! `/metrics` ([`admin`]), the watch backoff ([`backoff`]), tracking of API refusals for
//! readiness ([`api_access`]), and the producer's command line and ConfigMap key as the operator
//! renders them ([`producer`], [`flags`]).

pub mod admin;
pub mod api_access;
pub mod backoff;
pub mod flags;
pub mod leader;
pub mod logging;
pub mod producer;
