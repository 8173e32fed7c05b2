//! Whether the cluster serves the InferencePool API (Gateway API Inference Extension), noticed
//! when it appears: a timer rechecks discovery, and reconcile checks again before it reports
//! `PoolAPIMissing`. The pool watches start when the API appears, and every policy is
//! reconciled then (so those that said `PoolAPIMissing` move on at once).

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::{ApiResource, GroupVersionKind};
use kube::Client;
use tokio::sync::watch;

pub const GROUP: &str = "inference.networking.k8s.io";
pub const VERSION: &str = "v1";
pub const KIND: &str = "InferencePool";

/// The InferencePool v1 resource.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, VERSION, KIND))
}

pub struct PoolApi {
    present: watch::Sender<bool>,
    /// How often discovery is asked again while the API is missing.
    pub recheck: Duration,
}

impl PoolApi {
    pub fn new(recheck: Duration) -> Self {
        PoolApi {
            present: watch::Sender::new(false),
            recheck,
        }
    }

    pub fn present(&self) -> bool {
        *self.present.borrow()
    }

    /// Asks discovery now and records the answer; an error that says nothing about the API
    /// (the API server unreachable) keeps the previous answer.
    pub async fn check(&self, client: &Client) -> bool {
        let answer = match kube::discovery::pinned_kind(
            client,
            &GroupVersionKind::gvk(GROUP, VERSION, KIND),
        )
        .await
        {
            Ok(_) => Some(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Some(false),
            Err(kube::Error::Discovery(_)) => Some(false),
            Err(error) => {
                tracing::debug!(%error, "InferencePool discovery failed; keeping the last answer");
                None
            }
        };
        if let Some(present) = answer {
            self.set(present);
        }
        self.present()
    }

    pub fn set(&self, present: bool) {
        self.present.send_if_modified(|value| {
            let changed = *value != present;
            *value = present;
            changed
        });
        if present {
            tracing::debug!("the InferencePool API is served");
        }
    }

    /// Rechecks discovery every `recheck` until the API is there, then keeps an eye on it at the
    /// same pace.
    pub async fn recheck_forever(&self, client: Client) {
        loop {
            let was = self.present();
            let now = self.check(&client).await;
            if now && !was {
                tracing::info!("the InferencePool API appeared; watching InferencePools");
            }
            tokio::time::sleep(self.recheck).await;
        }
    }

    /// Resolves once the API is served.
    pub async fn served(&self) {
        let mut present = self.present.subscribe();
        let _ = present.wait_for(|present| *present).await;
    }

    /// One item each time the API appears after this call.
    pub fn appearances(&self) -> impl Stream<Item = ()> + Send + 'static {
        let present = self.present.subscribe();
        let was = *present.borrow();
        futures::stream::unfold((present, was), |(mut present, mut was)| async move {
            loop {
                let now = *present.borrow_and_update();
                if now && !was {
                    return Some(((), (present, true)));
                }
                was = now;
                present.changed().await.ok()?;
            }
        })
        .boxed()
    }
}
