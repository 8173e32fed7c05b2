//! An ext_proc stream driven as Envoy's data plane drives it, over real gRPC on loopback.

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_response, ProcessingRequest, ProcessingResponse,
};
use tokio::sync::mpsc;
use tonic::Streaming;

use super::{Local, PATIENCE};

/// One ext_proc stream, as the data plane holds it.
pub struct ExtProc {
    requests: mpsc::Sender<ProcessingRequest>,
    responses: Streaming<ProcessingResponse>,
}

impl ExtProc {
    pub async fn open(local: &Local) -> ExtProc {
        let channel = tonic::transport::Endpoint::from_shared(local.epp.clone())
            .expect("a valid address")
            .connect()
            .await
            .expect("connect to the endpoint picker");
        Self::on(channel).await
    }

    /// A stream on `channel`: the streams of clones of one channel share its connection.
    pub async fn on(channel: tonic::transport::Channel) -> ExtProc {
        let mut client = ExternalProcessorClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let (requests, outbound) = mpsc::channel(16);
        let responses = client
            .process(tokio_stream::wrappers::ReceiverStream::new(outbound))
            .await
            .expect("open an ext_proc stream")
            .into_inner();
        ExtProc {
            requests,
            responses,
        }
    }

    pub async fn send(&self, request: ProcessingRequest) {
        self.requests
            .send(request)
            .await
            .expect("the stream is open");
    }

    /// Sends unless the stream is gone (the producer ended it); whether it was sent.
    pub async fn offer(&self, request: ProcessingRequest) -> bool {
        self.requests.send(request).await.is_ok()
    }

    pub async fn next(&mut self) -> ProcessingResponse {
        tokio::time::timeout(PATIENCE, self.responses.message())
            .await
            .expect("an answer in time")
            .expect("no gRPC error")
            .expect("an answer, not the end of the stream")
    }

    /// The next answer, or how the stream ended instead: `Ok(None)` for a clean end.
    pub async fn next_or_end(&mut self) -> Result<Option<ProcessingResponse>, tonic::Status> {
        self.next_within(PATIENCE)
            .await
            .expect("an answer or the end in time")
    }

    /// [`ExtProc::next_or_end`] within `wait`; `None` when nothing came.
    pub async fn next_within(
        &mut self,
        wait: std::time::Duration,
    ) -> Option<Result<Option<ProcessingResponse>, tonic::Status>> {
        tokio::time::timeout(wait, self.responses.message())
            .await
            .ok()
    }

    /// The stream ends cleanly (no gRPC error) with no further answer.
    pub async fn ends(&mut self) {
        let end = tokio::time::timeout(PATIENCE, self.responses.message())
            .await
            .expect("the end in time");
        assert!(matches!(end, Ok(None)), "expected a clean end, got {end:?}");
    }
}

/// The status of an immediate response.
pub fn immediate(response: &ProcessingResponse) -> (i32, serde_json::Value) {
    let Some(processing_response::Response::ImmediateResponse(immediate)) = &response.response
    else {
        panic!("not an immediate response: {response:?}");
    };
    let body = serde_json::from_slice(&immediate.body).unwrap();
    (immediate.status.as_ref().unwrap().code, body)
}
