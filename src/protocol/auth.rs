//! The frames of the challenge and response that open a connection to a server with a secret
//! (see [`crate::security::auth`]), before any other frame: the client's nonce, the identity it will prove
//! and the index of the server it dialed (`AUTH_HELLO`), the server's nonce, epoch and proof
//! (`AUTH_CHALLENGE`), the client's proof (`AUTH_PROOF`). Fixed layouts, each a few dozen
//! bytes.

use super::HEADER;
use crate::security::auth::{Identity, LEN};

/// Client to server: a magic number, then the client's nonce.
pub const AUTH_HELLO: u8 = 10;
/// Client to server: the client's proof.
pub const AUTH_PROOF: u8 = 11;
/// Server to client: the server's nonce, then its proof.
pub const AUTH_CHALLENGE: u8 = 108;

/// Marks an authentication request (`oar-auth`).
const AUTH_MAGIC: u64 = u64::from_le_bytes(*b"oar-auth");

/// One frame: header and payload (every payload here is a multiple of 8 bytes).
fn frame(kind: u8, parts: &[&[u8]]) -> Vec<u8> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut bytes = Vec::with_capacity(HEADER + len);
    bytes.extend((len as u32).to_le_bytes());
    bytes.extend([kind, 0, 0, 0]);
    for p in parts {
        bytes.extend_from_slice(p);
    }
    bytes
}

/// The client's first frame: its nonce, the identity it will prove, the server it dialed.
pub fn hello(nonce: &[u8; LEN], identity: Identity, server: u64) -> Vec<u8> {
    let (kind, n) = identity.code();
    frame(AUTH_HELLO, &[&AUTH_MAGIC.to_le_bytes(), nonce, &kind.to_le_bytes(), &n.to_le_bytes(), &server.to_le_bytes()])
}

/// The client's nonce, identity and dialed server from an `AUTH_HELLO` payload.
pub fn parse_hello(payload: &[u8]) -> Option<([u8; LEN], Identity, u64)> {
    let (magic, rest) = payload.split_first_chunk::<8>()?;
    (u64::from_le_bytes(*magic) == AUTH_MAGIC).then_some(())?;
    let (nonce, rest) = rest.split_first_chunk::<LEN>()?;
    let (kind, rest) = rest.split_first_chunk::<8>()?;
    let (n, server) = rest.split_first_chunk::<8>()?;
    let server: [u8; 8] = server.try_into().ok()?;
    let identity = Identity::from_code(u64::from_le_bytes(*kind), u64::from_le_bytes(*n))?;
    Some((*nonce, identity, u64::from_le_bytes(server)))
}

/// The server's challenge: its nonce, its epoch, its proof.
pub fn challenge(nonce: &[u8; LEN], epoch: u64, proof: &[u8; LEN]) -> Vec<u8> {
    frame(AUTH_CHALLENGE, &[nonce, &epoch.to_le_bytes(), proof])
}

/// The server's nonce, epoch and proof from an `AUTH_CHALLENGE` payload.
pub fn parse_challenge(payload: &[u8]) -> Option<([u8; LEN], u64, [u8; LEN])> {
    let (nonce, rest) = payload.split_first_chunk::<LEN>()?;
    let (epoch, proof) = rest.split_first_chunk::<8>()?;
    Some((*nonce, u64::from_le_bytes(*epoch), proof.try_into().ok()?))
}

/// The client's proof.
pub fn proof(proof: &[u8; LEN]) -> Vec<u8> {
    frame(AUTH_PROOF, &[proof])
}

/// The client's proof from an `AUTH_PROOF` payload.
pub fn parse_proof(payload: &[u8]) -> Option<[u8; LEN]> {
    payload.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_wrong_sizes_are_refused() {
        let (n, p) = ([1u8; LEN], [2u8; LEN]);
        let h = hello(&n, Identity::Trainer(3), 1);
        assert_eq!((h[4], h.len()), (AUTH_HELLO, HEADER + 8 + LEN + 24));
        assert_eq!(parse_hello(&h[HEADER..]), Some((n, Identity::Trainer(3), 1)));
        assert_eq!(parse_hello(&h[HEADER + 1..]), None);
        assert_eq!(parse_hello(&hello(&n, Identity::Tool, 0)[HEADER..]).map(|h| h.1), Some(Identity::Tool));
        assert_eq!(parse_challenge(&challenge(&n, 7, &p)[HEADER..]), Some((n, 7, p)));
        assert_eq!(parse_proof(&proof(&p)[HEADER..]), Some(p));
        assert_eq!(parse_proof(&[0; 31]), None);
    }
}
