//! The burst-prefix producer: inference request bodies in, per-replica prefix-match info out.
//!
//! Follow one request: [`server`] takes the body of `POST /v1/produce`, [`request`] parses it
//! into prompts, [`window`] hashes it under the window's config and holds it until the window
//! is sealed, [`batch`] maps the window onto the planner and back to endpoint ids, and
//! [`response`] turns the placement into per-endpoint matches.
//!
//! Around it: [`config_store`] (the config in force) fed by [`config_file`] or [`configmap`],
//! [`metrics`] and [`admin`] on the admin port, [`serve`] for the wiring and shutdown, and
//! [`demo`] for a self-contained run on a built-in config.

pub mod admin;
pub mod app;
pub mod batch;
pub mod config_file;
pub mod config_store;
pub mod configmap;
pub mod demo;
pub mod error;
pub mod metrics;
pub mod request;
pub mod response;
pub mod serve;
pub mod server;
pub mod window;
