//! The exit status of an `oar` process, from the error it stops with (see [`crate::base::exit`]):
//! here, above every layer whose errors it reads.

use crate::base::exit::{PeerLost, FAILED, PEER_LOST};
use crate::client::ClientError;

/// The exit status for `error`: [`PEER_LOST`] when anything in its chain is a lost peer (a
/// server lost, or a server that gave up waiting for another trainer: the trainer that waited
/// did nothing wrong, and a launcher names the missing one first and may restart this one),
/// else [`FAILED`].
pub fn status(error: &anyhow::Error) -> i32 {
    let for_another = |e: &ClientError| e.server_was_lost() || e.is_wait_timed_out();
    let lost = error
        .chain()
        .any(|cause| cause.is::<PeerLost>() || cause.downcast_ref::<ClientError>().is_some_and(for_another));
    if lost {
        PEER_LOST
    } else {
        FAILED
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn a_lost_peer_anywhere_in_the_chain_is_status_3_and_anything_else_1() {
        let server = anyhow::Error::new(PeerLost("trainer 0 disconnected".into()));
        assert_eq!(status(&server), PEER_LOST);
        let trainer = Err::<(), _>(ClientError::Lost {
            index: 1,
            addr: "127.0.0.1:1".into(),
            waited: std::time::Duration::from_secs(1),
            cause: "closed".into(),
        })
        .context("pass 0, step 3")
        .unwrap_err();
        assert_eq!(status(&trainer), PEER_LOST);
        assert_eq!(status(&anyhow::anyhow!("part-00000: pipe_command failed")), FAILED);
        let refused = ClientError::Usage("bad".into());
        assert_eq!(status(&anyhow::Error::new(refused).context("push")), FAILED);
        let refusal = |code| ClientError::Refused {
            index: 0,
            addr: "127.0.0.1:1".into(),
            what: "a push",
            code,
            message: "sync step 3 timed out after 2s waiting for trainer(s) [1] to push or commit".into(),
        };
        let waited = anyhow::Error::new(refusal(crate::protocol::ErrorCode::Timeout)).context("pass 0, step 3");
        assert_eq!(status(&waited), PEER_LOST, "the server gave up waiting for another trainer");
        let own = anyhow::Error::new(refusal(crate::protocol::ErrorCode::NonFinite)).context("pass 0, step 3");
        assert_eq!(status(&own), FAILED, "a push refused for what it held");
    }
}
