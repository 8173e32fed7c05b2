//! The producer's core (`burst-prefix-core`): every rule a request meets, and no front-end.
//!
//! A request's path through a [`Producer`] is four stages, in the order [`path`] writes them
//! (docs/architecture.md):
//! [`admit`] (does this producer take it; its body under the limits), [`read`] (parsed, hinted,
//! tokenized, hashed, once), [`place`] (the window or on arrival; one function builds the
//! placement and counts its outcome) and [`route`] (where it goes, and the handle its front-end
//! holds until its answer ends). Every refusal on the way is a [`PlaceError`], counted once as a
//! [`Refused`].
//!
//! Around the path: [`config_store`] (the config in force, fed by a config source), [`live`]
//! (requests in flight and cool-downs per endpoint), [`engines`] (what the engines say),
//! [`budget`] (the bytes requests hold), [`metrics`], and [`whole_batch`] (a whole batch planned
//! at once: `POST /v1/plan` and the `plan` subcommand).

pub mod admit;
pub mod budget;
pub mod clock;
pub mod config_store;
pub mod engines;
pub mod error;
pub mod live;
pub mod metrics;
pub mod path;
pub mod place;
pub mod read;
pub mod route;
pub mod whole_batch;

pub use admit::{BodyReader, Hints, Limits};
pub use clock::{Clock, ClockHand};
pub use config_store::{ConfigOrigin, Snapshot};
pub use error::{PlaceError, Refused};
pub use live::{Attempted, CoolDown, CooldownReason};
pub use path::{Admission, KeepBody, Placed, Producer, Routed};
pub use place::Placement;
pub use route::{Handle, Route};
