//! Writing a connection's replies: within the job's `--timeout` (a peer that reads no reply
//! for that long is closed, and what its connection held let go), a pull's reply counted against
//! the peer's share while it is written, and the row buffers of the last pull kept for the next.

use std::sync::atomic::Ordering::Relaxed;

use tokio::io::AsyncWrite;

use super::shares::Share;
use super::{Answer, Reply, State};
use crate::protocol::{encode_values, write_frame, ErrorCode, ProtocolError, Response};

/// Row buffers of a connection's last pull reply, handed back for the next one.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) sparse: Vec<Vec<f32>>,
}

/// Writes `reply` within the job's `--timeout`; a pull's row buffers go back to `scratch` for
/// the next (up to [`KEPT_REPLY_BYTES`]). A pull's reply counts against the peer's `share`
/// until it is written: one past the share is refused instead, so a peer that pulls and never
/// reads holds at most its share, and only for `--timeout`.
pub(super) async fn send<W: AsyncWrite + Unpin>(
    state: &State,
    wr: &mut W,
    reply: Reply,
    scratch: &mut Scratch,
    share: Option<&Share>,
) -> Result<(), ProtocolError> {
    let out = &state.counters.frame_bytes_out;
    match reply.unwrap_or_else(|(code, message)| Answer::Response(Response::Error { code, message })) {
        Answer::Response(response) => {
            let frame = response.encode();
            out.fetch_add(frame.len() as u64, Relaxed);
            write_within(state, wr, &frame).await?
        }
        Answer::Values { version, dense, sparse } => {
            let frame = encode_values(version, &dense, &sparse);
            let len = frame.len();
            if let Some(Err((held, most))) = share.map(|s| s.bytes.take(len)) {
                let who = share.map_or("", |s| s.who.as_str());
                let message = format!(
                    "a reply of {len} bytes refused: {who} hold {held} of the {most} bytes one peer may in requests and \
                     unread replies (an eighth of --max-receive-mb): read the replies before asking for more"
                );
                let refused = Response::Error { code: ErrorCode::TooLarge, message };
                return write_within(state, wr, &refused.encode()).await;
            }
            out.fetch_add(len as u64, Relaxed);
            let written = write_within(state, wr, &frame).await;
            if let Some(s) = share {
                s.bytes.give(len);
            }
            written?;
            if sparse.iter().map(|rows| rows.capacity() * 4).sum::<usize>() <= KEPT_REPLY_BYTES {
                scratch.sparse = sparse;
            }
        }
        Answer::LastClose => {
            write_within(state, wr, &Response::Done.encode()).await?;
            state.all_closed.send_replace(true);
        }
    }
    Ok(())
}

/// The most a connection keeps of its last pull reply's row buffers for the next: a larger
/// reply's are let go, so a peer's many connections do not each keep their largest.
const KEPT_REPLY_BYTES: usize = 16 << 20;

/// Writes `frame` within the job's `--timeout`: a peer that reads no reply for that long is
/// closed, and what the connection held is let go.
async fn write_within<W: AsyncWrite + Unpin>(
    state: &State,
    wr: &mut W,
    frame: &crate::protocol::Frame<'_>,
) -> Result<(), ProtocolError> {
    match tokio::time::timeout(state.config.timeout, write_frame(wr, frame)).await {
        Ok(written) => written,
        Err(_) => Err(ProtocolError::Malformed(format!(
            "the peer read no reply for {:?} (--timeout): closed",
            state.config.timeout
        ))),
    }
}
