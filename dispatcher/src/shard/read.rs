//! Reading a range of one lane back from JetStream for a refill: one batched direct get
//! (`$JS.API.DIRECT.GET.<stream>` with `batch`: the messages, then an end-of-batch
//! status) instead of one request per message, which made the server encode every
//! message of a backlog as a JSON API response.
//!
//! Any replica may answer a direct get, and a replica's copy can lag the leader's by a
//! tail of recent messages (never by one in the middle: replicas apply in order). So a
//! batch that ends before the range's end is taken for "nothing more up to `until`"
//! only once the leader confirms it, with one read of the first message after the last
//! one returned; a lagging replica must not make the lane forget messages that exist.

use std::time::Duration;

use async_nats::jetstream::stream::{RawMessageError, RawMessageErrorKind, Stream};
use async_nats::{HeaderMap, StatusCode};
use bytes::Bytes;
use futures::StreamExt;

use crate::endpoint::RefillRange;

/// Most messages asked for in one batch.
const BATCH: usize = 256;
/// Most bytes one batch may carry (the server stops after the message that passes it).
const MAX_BYTES: usize = 8 << 20;
/// Longest wait for a batch to end.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// A lane message read back.
pub struct Stored {
    pub seq: u64,
    pub headers: HeaderMap,
    pub payload: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("direct get: {0}")]
    Nats(#[from] async_nats::Error),
    #[error("direct get answered {0}")]
    Status(StatusCode),
    #[error("direct get: no end of batch within {READ_TIMEOUT:?}")]
    Timeout,
    #[error("leader read: {0}")]
    Leader(#[from] RawMessageError),
}

/// Reads up to `range.room` messages of `subject` with sequences in
/// `range.from..=range.until`. Returns them and where to go on (`None`: the range is
/// read to its end).
pub async fn range(
    client: &async_nats::Client,
    stream: &Stream,
    subject: &str,
    range: RefillRange,
) -> Result<(Vec<Stored>, Option<u64>), ReadError> {
    let want = range.room.clamp(1, BATCH);
    let name = &stream.cached_info().config.name;
    let (mut read, ended) = batch(client, name, subject, range.from, want).await?;
    if let Some(beyond) = read.iter().position(|m| m.seq > range.until) {
        // The responder has messages past the range: it holds all of the range.
        read.truncate(beyond);
        return Ok((read, None));
    }
    let after = read.last().map_or(range.from, |m| m.seq + 1);
    if after > range.until {
        return Ok((read, None));
    }
    if !ended || read.len() >= want {
        return Ok((read, Some(after)));
    }
    // The batch ended inside the range: true only if the leader agrees.
    match stream
        .get_first_raw_message_by_subject(subject, after)
        .await
    {
        Ok(message) if message.sequence <= range.until => {
            let next = message.sequence + 1;
            read.push(Stored {
                seq: message.sequence,
                headers: message.headers,
                payload: message.payload,
            });
            Ok((read, Some(next)))
        }
        Ok(_) => Ok((read, None)),
        Err(error) if matches!(error.kind(), RawMessageErrorKind::NoMessageFound) => {
            Ok((read, None))
        }
        Err(error) if read.is_empty() => Err(error.into()),
        Err(_) => Ok((read, Some(after))),
    }
}

/// One batched direct get of the messages of `subject` from `from` on. Returns them and
/// whether the batch ended (an end-of-batch or not-found status) rather than timing out
/// part-way.
async fn batch(
    client: &async_nats::Client,
    stream: &str,
    subject: &str,
    from: u64,
    batch: usize,
) -> Result<(Vec<Stored>, bool), ReadError> {
    let inbox = client.new_inbox();
    let mut replies = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| ReadError::Nats(e.into()))?;
    let request = serde_json::json!({
        "seq": from,
        "next_by_subj": subject,
        "batch": batch,
        "max_bytes": MAX_BYTES,
    });
    client
        .publish_with_reply(
            format!("$JS.API.DIRECT.GET.{stream}"),
            inbox,
            request.to_string().into(),
        )
        .await
        .map_err(|e| ReadError::Nats(e.into()))?;
    let deadline = tokio::time::Instant::now() + READ_TIMEOUT;
    let mut read = Vec::new();
    let ended = loop {
        let reply = match tokio::time::timeout_at(deadline, replies.next()).await {
            Ok(Some(reply)) => reply,
            Ok(None) | Err(_) if !read.is_empty() => break false,
            Ok(None) | Err(_) => return Err(ReadError::Timeout),
        };
        match reply.status {
            // End of batch (204), or nothing from `from` on (404).
            Some(status) if matches!(status.as_u16(), 204 | 404) => break true,
            Some(status) if status != StatusCode::OK => return Err(ReadError::Status(status)),
            _ => {}
        }
        let headers = reply.headers.unwrap_or_default();
        let Some(seq) = headers
            .get("Nats-Sequence")
            .and_then(|v| v.as_str().parse().ok())
        else {
            continue;
        };
        read.push(Stored {
            seq,
            headers,
            payload: reply.payload,
        });
        if read.len() >= batch {
            // The end-of-batch status follows; not waiting for it.
            break true;
        }
    };
    let _ = replies.unsubscribe().await;
    Ok((read, ended))
}
