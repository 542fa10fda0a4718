//! The exit status of an `oar` process, from the error it stops with (see [`crate::base::exit`]):
//! here, above every layer whose errors it reads.

use crate::base::exit::{PeerLost, FAILED, PEER_LOST};
use crate::client::ClientError;

/// The exit status for `error`: [`PEER_LOST`] when anything in its chain is a lost peer, else
/// [`FAILED`].
pub fn status(error: &anyhow::Error) -> i32 {
    let lost = error.chain().any(|cause| {
        cause.is::<PeerLost>() || cause.downcast_ref::<ClientError>().is_some_and(ClientError::server_was_lost)
    });
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
    }
}
