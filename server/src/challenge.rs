//! Fresh nonces for the token's challenge-response
//! (`sluice_protocol::auth`): from the kernel's generator.

use std::io::Read;

use sluice_protocol::auth::NONCE_BYTES;

/// 16 bytes of /dev/urandom (one open per challenge, which comes once a
/// connection, before HELLO; no `unsafe` for a getrandom call).
pub fn random_nonce() -> std::io::Result<[u8; NONCE_BYTES]> {
    let mut nonce = [0u8; NONCE_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut nonce)?;
    Ok(nonce)
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_nonces_differ() {
        assert_ne!(
            super::random_nonce().unwrap(),
            super::random_nonce().unwrap()
        );
    }
}
