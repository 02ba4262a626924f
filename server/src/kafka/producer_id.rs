//! The InitProducerId answer: an idempotent producer's id is a session the metadata group
//! registers — unique and never reused, like a native client's `Register` — with epoch 0. The
//! partitions' producer tables then deduplicate its batches by (id, epoch, sequence) exactly as
//! they do a native producer's. A producer that asks again (after UNKNOWN_PRODUCER_ID, say)
//! gets a new id rather than a bumped epoch; Kafka's clients take either.
//!
//! Only the metadata group's primary registers: another node of a cluster registers the session
//! there over the native protocol (`forward`), since clients send InitProducerId to any broker.
//! When that fails too (the primary unknown or unreachable) the answer is NOT_COORDINATOR, and
//! the client asks again. Transactional producers are refused
//! (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): Shoal has no transactions yet.

use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_kafka::kafka_protocol::messages::{InitProducerIdResponse, ProducerId};
use shoal_kafka::request::InitProducerIdRequest;
use shoal_proto::protocol::{ErrorCode, Operation, decode_session};

use super::Connection;
use super::errors::kafka_error;
use super::forward;
use crate::metadata::MetaCommand;
use crate::shard::{Body, Outcome, Work};

pub(super) async fn answer(
    connection: &mut Connection,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let refused = |error: ResponseError| {
        InitProducerIdResponse::default()
            .with_error_code(error.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    if request.transactional_id.is_some() {
        return refused(ResponseError::TransactionalIdAuthorizationFailed);
    }
    let granted = |session: u64| {
        InitProducerIdResponse::default()
            .with_producer_id(ProducerId(i64::try_from(session).unwrap_or(i64::MAX)))
            .with_producer_epoch(0)
    };
    let client = connection.next_request(Operation::Register);
    let (reply, answer) = flume::bounded(1);
    let work = Work::Metadata { client, command: MetaCommand::RegisterSession, reply };
    if connection.send(0, work).await.is_err() {
        return refused(ResponseError::CoordinatorNotAvailable);
    }
    match answer.recv_async().await {
        Ok(Outcome { error: 0, body: Body::Encoded(body) }) => match decode_session(&body) {
            Ok(session) => granted(session),
            Err(_) => refused(ResponseError::UnknownServerError),
        },
        Ok(Outcome { body: Body::NotPrimary { primary, .. }, .. }) => {
            let config = &connection.context.config;
            let catalog = connection.context.published.latest();
            let Some(address) = catalog.nodes.client_address(&config.cluster, primary) else {
                return refused(ResponseError::NotCoordinator);
            };
            match forward::register_on(address, config.cluster.id, connection.client).await {
                Ok(session) => granted(session),
                Err(why) => {
                    tracing::debug!(primary, %address, why, "InitProducerId not forwarded");
                    refused(ResponseError::NotCoordinator)
                }
            }
        }
        Ok(Outcome { error, .. }) if error == ErrorCode::NotPrimary as u32 => {
            refused(ResponseError::NotCoordinator)
        }
        Ok(Outcome { error, .. }) => {
            refused(kafka_error(error).unwrap_or(ResponseError::UnknownServerError))
        }
        Err(_) => refused(ResponseError::CoordinatorNotAvailable),
    }
}
