//! OTLP/gRPC: the collector's `LogsService/Export`, `TraceService/Export` and
//! `MetricsService/Export`, gzip accepted. Retryable refusals carry
//! `RetryInfo`, as the OTLP spec asks.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::codec::CompressionEncoding;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::{Refusal, Shared};
use crate::connectors::otlp::Signal;

#[derive(Clone)]
struct Receiver(Arc<Shared>);

pub(super) async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    stop: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let limit = shared.config.max_request_bytes;
    let receiver = Receiver(shared);
    macro_rules! service {
        ($server:ident) => {
            $server::new(receiver.clone())
                .accept_compressed(CompressionEncoding::Gzip)
                .send_compressed(CompressionEncoding::Gzip)
                .max_decoding_message_size(limit)
        };
    }
    Server::builder()
        .add_service(service!(LogsServiceServer))
        .add_service(service!(TraceServiceServer))
        .add_service(service!(MetricsServiceServer))
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), async move {
            stop.cancelled().await
        })
        .await
}

impl Receiver {
    async fn export<S: Signal>(
        &self,
        request: Request<S>,
    ) -> Result<Response<S::Response>, Status> {
        let shared = &self.0;
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|value| value.as_bytes());
        let answer = if shared.authorized(authorization) {
            shared.export(request.into_inner()).await
        } else {
            Err(Refusal::Unauthorized)
        };
        let code = match &answer {
            Ok(_) => "ok".to_owned(),
            Err(refusal) => format!("{:?}", status(shared, refusal.clone()).code()),
        };
        metrics::counter!(
            "iggy_connector_otlp_source_responses_total",
            "connector_key" => shared.key.clone(),
            "protocol" => "grpc",
            "status" => code
        )
        .increment(1);
        answer
            .map(Response::new)
            .map_err(|refusal| status(shared, refusal))
    }
}

fn status(shared: &Shared, refusal: Refusal) -> Status {
    let retry = || ErrorDetails::with_retry_info(Some(shared.retry_after()));
    match refusal {
        Refusal::Unauthorized => Status::unauthenticated(
            "a valid `authorization: Bearer <token>` metadata entry is required",
        ),
        Refusal::BadRequest(message) => Status::invalid_argument(message),
        Refusal::TooLarge(message) => Status::invalid_argument(message),
        Refusal::NotReceived(signal) => Status::unimplemented(format!(
            "this receiver takes no {signal} (no [[streams]] entry for it)"
        )),
        Refusal::Unavailable(message) => {
            Status::with_error_details(Code::Unavailable, message, retry())
        }
        Refusal::Exhausted(message) => {
            Status::with_error_details(Code::ResourceExhausted, message, retry())
        }
    }
}

#[tonic::async_trait]
impl LogsService for Receiver {
    async fn export(
        &self,
        request: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        Receiver::export(self, request).await
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        Receiver::export(self, request).await
    }
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        Receiver::export(self, request).await
    }
}
