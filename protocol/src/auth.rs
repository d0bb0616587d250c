//! Mutual proof of the token, for a peer that must not trust whoever
//! answers at an address (a follower and its `--replica-of`): before it
//! sends anything of its own, the node it connects to proves that it
//! knows the token, and then the peer proves it too, and neither sends
//! the token itself.
//!
//! 1. The peer sends CHALLENGE with a fresh 16-byte nonce `c`.
//! 2. The node answers CHALLENGE_OK with its own fresh nonce `s` and
//!    [`node_proof`]`(token, c, s)`. A node without a token answers
//!    AUTH_FAILED: it cannot prove one.
//! 3. The peer checks the proof ([`verify`]); a wrong one ends the
//!    connection before the peer has sent its token or anything it holds.
//!    Then it sends HELLO whose token field is [`peer_proof`]`(token, s,
//!    c)`; on a connection that sent CHALLENGE, the node accepts only that
//!    proof, never the bare token.
//!
//! Both proofs are HMAC-SHA256 keyed by the token over a label and both
//! nonces, the labels different so that neither side's proof is the
//! other's. Fresh nonces make a recorded exchange useless for another. The
//! token should be long and random: a proof lets an eavesdropper test
//! guesses offline, as with any shared-secret challenge-response; the
//! link is not encrypted (docs/SECURITY.md).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a nonce.
pub const NONCE_BYTES: usize = 16;
/// Bytes of a proof.
pub const PROOF_BYTES: usize = 32;

const NODE_LABEL: &[u8] = b"sluice-v1 node proof";
const PEER_LABEL: &[u8] = b"sluice-v1 peer proof";

fn mac(token: &[u8], label: &[u8], a: &[u8; NONCE_BYTES], b: &[u8; NONCE_BYTES]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes a key of any length");
    m.update(label);
    m.update(a);
    m.update(b);
    m
}

/// The node's proof: it knows `token`, for the peer's nonce `peer` and its
/// own `node`.
pub fn node_proof(
    token: &[u8],
    peer: &[u8; NONCE_BYTES],
    node: &[u8; NONCE_BYTES],
) -> [u8; PROOF_BYTES] {
    mac(token, NODE_LABEL, peer, node)
        .finalize()
        .into_bytes()
        .into()
}

/// The peer's proof, sent in HELLO's token field after a CHALLENGE.
pub fn peer_proof(
    token: &[u8],
    node: &[u8; NONCE_BYTES],
    peer: &[u8; NONCE_BYTES],
) -> [u8; PROOF_BYTES] {
    mac(token, PEER_LABEL, node, peer)
        .finalize()
        .into_bytes()
        .into()
}

/// Whether `proof` is the node's proof for these nonces (in constant time).
pub fn verify_node(
    token: &[u8],
    peer: &[u8; NONCE_BYTES],
    node: &[u8; NONCE_BYTES],
    proof: &[u8],
) -> bool {
    mac(token, NODE_LABEL, peer, node)
        .verify_slice(proof)
        .is_ok()
}

/// Whether `proof` is the peer's proof for these nonces (in constant
/// time).
pub fn verify_peer(
    token: &[u8],
    node: &[u8; NONCE_BYTES],
    peer: &[u8; NONCE_BYTES],
    proof: &[u8],
) -> bool {
    mac(token, PEER_LABEL, node, peer)
        .verify_slice(proof)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_check_only_with_the_token_the_nonces_and_the_side() {
        let (c, s) = ([1u8; NONCE_BYTES], [2u8; NONCE_BYTES]);
        let node = node_proof(b"token", &c, &s);
        assert!(verify_node(b"token", &c, &s, &node));
        assert!(!verify_node(b"tokem", &c, &s, &node));
        assert!(!verify_node(b"token", &s, &c, &node));
        assert!(!verify_node(b"token", &c, &[3; NONCE_BYTES], &node));
        assert!(!verify_node(b"token", &c, &s, &node[..31]));
        // One side's proof is never the other's.
        assert!(!verify_peer(b"token", &s, &c, &node));
        let peer = peer_proof(b"token", &s, &c);
        assert!(verify_peer(b"token", &s, &c, &peer));
        assert_ne!(peer, node);
        // RFC 4231's first HMAC-SHA256 case, through the same Mac: the
        // primitive is the standard one.
        let mut m = Hmac::<Sha256>::new_from_slice(&[0x0b; 20]).unwrap();
        m.update(b"Hi There");
        let want = "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7";
        let got: String = m
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, want);
    }
}
